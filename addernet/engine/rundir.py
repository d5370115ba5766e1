"""Guards of what a run writes: one run at a time in a run dir, no stale temporaries, every failure in train.log,
a failed launch leaves an existing run dir as it was, the run dir alone is enough to resume it, and an output
file given on the command line (results_file=, out=) never replaces an input or a file of another kind.

The lock is a kernel file lock (``fcntl.flock``) on ``<run dir>/.lock``, held by rank 0 for the life
of the run: the kernel drops it when the process exits in any way (kill -9 included), so a crashed
run never leaves a stale lock behind. The file itself stays (removing it would let two runs lock two
different files of the same name); it holds the pid of the last run that locked it.
"""

import contextlib
import fcntl
import glob
import os
import time

from omegaconf import OmegaConf

from ..distributed import env_rank
from ..errors import ConfigError

LOCK = ".lock"


class RunDirBusy(ConfigError):
    """Another process holds the run directory's lock."""


def _unwritable(run_dir, e):
    return ConfigError(
        f"cannot write to the run dir {run_dir} ({e.strerror or e}); make it writable or choose "
        f"another one with hydra.run.dir=/path/to/run."
    )


class RunDirLock:
    """The open, locked <run dir>/.lock; ``close()`` releases it (so does the end of the process).

    A forked child (a DataLoader worker) shares the lock through its copy of the descriptor and would
    keep the run dir locked after the main process was killed; children close their copy at once.
    """

    held = set()  # descriptors this process holds a run-dir lock on

    def __init__(self, fd):
        self.fd = fd
        RunDirLock.held.add(fd)

    def close(self):
        if self.fd is not None:
            RunDirLock.held.discard(self.fd)
            os.close(self.fd)
            self.fd = None


def _close_inherited_locks():
    for fd in RunDirLock.held:
        os.close(fd)
    RunDirLock.held = set()


os.register_at_fork(after_in_child=_close_inherited_locks)


def lock_run_dir(run_dir):
    """A RunDirLock: an exclusive flock on ``<run dir>/.lock``, held until closed or the process exits.

    RunDirBusy at once when another run holds it; ConfigError when the run dir is not writable.
    """
    path = os.path.join(run_dir, LOCK)
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _unwritable(run_dir, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(
            f"the run dir {run_dir} is in use by another training run (pid {holder} holds {path}); "
            f"wait for it to finish, or start this run in another dir with hydra.run.dir=..."
        ) from None
    lock = RunDirLock(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        lock.close()
        raise _unwritable(run_dir, e) from None
    return lock


def remove_stale_temporaries(run_dir):
    """Delete the temporary files of writes killed mid-way (checkpoints/.*.tmp, metrics.jsonl.tmp); returns them.

    Only called while holding the lock, so no live run can own them.
    """
    stale = glob.glob(os.path.join(run_dir, "checkpoints", ".*.tmp")) + glob.glob(os.path.join(run_dir, "*.tmp"))
    for path in stale:
        os.remove(path)
    return stale


def log_failure(run_dir, error):
    """Append the error that ended the run to <run dir>/train.log (the console already shows it)."""
    path = os.path.join(run_dir, "train.log")
    if not os.path.isdir(run_dir):
        return
    kind = type(error).__name__
    message = str(error) if kind in ("Preempted", "Interrupted") else f"{kind}: {error}"
    try:
        with open(path, "a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][addernet.train][ERROR] run stopped: {message}\n")
    except OSError:
        pass  # an unwritable run dir was the error itself


def _key(override):
    return override.split("=", 1)[0].lstrip("+~")


def _given(argv, key):
    """The value of the last ``key=value`` in argv (Hydra's last one wins), or None."""
    values = [a.split("=", 1)[1] for a in argv if "=" in a and _key(a) == key]
    return values[-1] if values else None


def with_stored_overrides(argv):
    """(argv, the overrides added): a run dir to resume (``hydra.run.dir=<dir>`` or ``trainer.resume=<dir>``
    holding checkpoints/last.pt) gets the overrides it was launched with (its .hydra/overrides.yaml) first,
    so the dir alone resumes it; what argv gives itself wins. Multiruns are left as they are."""
    if "-m" in argv or "--multirun" in argv:
        return argv, []
    for key in ("hydra.run.dir", "trainer.resume"):
        run_dir = _given(argv, key)
        stored = os.path.join(run_dir or "", ".hydra", "overrides.yaml")
        if run_dir and os.path.isfile(os.path.join(run_dir, "checkpoints", "last.pt")) and os.path.isfile(stored):
            given = {_key(a) for a in argv if "=" in a}
            added = [str(o) for o in OmegaConf.load(stored) if _key(str(o)) not in given]
            return added + list(argv), added
    return argv, []


def _snapshot(run_dir):
    """The state of an existing run's dir a failed launch must leave: config.yaml's identity, .hydra/'s files."""
    config, hydra = os.path.join(run_dir, "config.yaml"), os.path.join(run_dir, ".hydra")
    if not os.path.isfile(config):
        return None
    stat = os.stat(config)
    files = {}
    for name in os.listdir(hydra) if os.path.isdir(hydra) else ():
        path = os.path.join(hydra, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size), files


def _restore_hydra(run_dir, files):
    hydra = os.path.join(run_dir, ".hydra")
    for name in set(os.listdir(hydra) if os.path.isdir(hydra) else ()) - set(files):
        os.remove(os.path.join(hydra, name))  # a file this launch added
    os.makedirs(hydra, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(hydra, name + ".tmp"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(hydra, name + ".tmp"), os.path.join(hydra, name))


@contextlib.contextmanager
def keep_run_dir_on_failure(argv):
    """Around a launch: when it fails (an exception or a non-zero exit) before the run wrote its config.yaml,
    an existing run dir's .hydra/ files (which Hydra rewrites before the run starts) are put back as they were.

    A run that got as far as writing config.yaml has passed every check: its .hydra/ describes it and stays.
    """
    run_dir = _given(argv, "hydra.run.dir")
    saved = _snapshot(run_dir) if run_dir and env_rank() == 0 and os.path.isdir(run_dir) else None
    try:
        yield
    except BaseException as e:
        if saved is not None and not (isinstance(e, SystemExit) and e.code in (0, None)):
            stat = os.stat(os.path.join(run_dir, "config.yaml"))
            if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == saved[0]:
                _restore_hydra(run_dir, saved[1])
        raise


def _looks_like_results(path):
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    lines = head.decode("utf-8", errors="replace").strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("{") and lines[0].endswith("}") and '"top1"' in lines[0]


def check_output_path(path, key, inputs=(), overwrite=False, results=False):
    """ConfigError when writing ``path`` (the ``key=`` setting) would replace an input file or a file of
    another kind. ``results``: it may replace an earlier one-line JSON results file; otherwise an existing
    file needs ``overwrite`` (and never one of ``inputs``)."""
    if not path:
        return
    target = os.path.realpath(str(path))
    for given in inputs:
        if given and os.path.exists(str(given)) and os.path.realpath(str(given)) == target:
            raise ConfigError(
                f"{key}={path} is the input checkpoint itself; writing it would destroy it. Give another path."
            )
    if not os.path.isfile(target) or os.path.getsize(target) == 0:
        return
    if results and _looks_like_results(target):
        return
    if results:
        raise ConfigError(
            f"{key}={path} exists and is not a results file (one JSON line); writing it would "
            f"replace it. Give another path, or delete the file first."
        )
    if not overwrite:
        raise ConfigError(
            f"{key}={path} exists; it is not replaced unless you pass overwrite=true (it may be a "
            f"training checkpoint). Give another path, or add overwrite=true."
        )
