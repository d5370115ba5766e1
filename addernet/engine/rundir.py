"""Guards of what a run writes: one run at a time in a run dir, no stale temporaries, every failure in train.log,
a failed launch leaves an existing run dir as it was and removes what a first launch created, the run dir (or a
checkpoint's stored config) alone is enough to resume it, and an output
file given on the command line (results_file=, out=) never replaces an input or a file of another kind.

The lock is a kernel file lock (``fcntl.flock``) on ``<run dir>/.lock``, held by rank 0 for the life
of the run: the kernel drops it when the process exits in any way (kill -9 included), so a crashed
run never leaves a stale lock behind. The file itself stays (removing it would let two runs lock two
different files of the same name); it holds the pid of the last run that locked it.
"""

import contextlib
import fcntl
import functools
import glob
import os
import shutil
import time

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from ..checkpoint import load_checkpoint
from ..config import config_dir
from ..config.entry import hydra_value
from ..distributed import env_rank
from ..errors import ConfigError
from .resume import flatten

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


ONE_SHOT = ("trainer.resume_override",)  # a permission for the launch that gives it: never recorded or replayed
FROM_CHECKPOINT_SKIP = ("trainer.resume", *ONE_SHOT)  # which checkpoint to start from belongs to the launch


@functools.cache
def _parser():
    return OverridesParser.create()


def _parsed(item):
    """Hydra's reading of one command-line item (quotes removed), or None for one it cannot read (Hydra reports
    it) and for items that are not overrides (-m)."""
    try:
        return _parser().parse_override(item)
    except HydraException:
        return None


def _key(override):
    parsed = _parsed(override)
    return parsed.key_or_group if parsed is not None else override.split("=", 1)[0].lstrip("+~")


def _given(argv, key):
    """The value of the last ``key=value`` in argv (Hydra's last one wins) as Hydra reads it, or None."""
    values = [p.value() for p in map(_parsed, argv) if p is not None and p.key_or_group == key]
    return None if not values or values[-1] is None else str(values[-1])


def drop_one_shot(run_dir):
    """Take ONE_SHOT overrides out of the launch record <run dir>/.hydra/overrides.yaml, which a later resume
    replays: trainer.resume_override=true applies to the launch that gives it, not to every later resume."""
    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.isfile(path):
        return
    recorded = [str(o) for o in OmegaConf.load(path)]
    kept = [o for o in recorded if _key(o) not in ONE_SHOT]
    if kept != recorded:
        OmegaConf.save(OmegaConf.create(kept), path + ".tmp")
        os.replace(path + ".tmp", path)


def config_overrides(config):
    """The overrides that compose ``config`` (a resolved training config, as checkpoints store it) from
    configs/train.yaml: each group's option (its ``name``; the logger group's selected options), then every value."""
    root, choices = config_dir(), []
    for group, node in config.items():
        if not isinstance(node, dict) or not os.path.isdir(os.path.join(root, group)):
            continue
        options = [n for n in node if os.path.isfile(os.path.join(root, group, f"{n}.yaml"))]
        if isinstance(node.get("name"), str) and os.path.isfile(os.path.join(root, group, f"{node['name']}.yaml")):
            choices.append(f"{group}={node['name']}")
        elif node and options == list(node):  # a list group: logger=[tensorboard,mlflow]
            choices.append(f"{group}=[{','.join(options)}]")
    # ++: also a key a task class adds outside the schema (+task.delay=...); the config check still sees every key
    values = [f"++{k}={hydra_value(v)}" for k, v in flatten(config).items() if not isinstance(v, dict)]
    return choices + values


def _checkpoint_overrides(path):
    """config_overrides of the config stored in the checkpoint at ``path`` ([] when it stores none)."""
    ckpt = load_checkpoint(path)
    config = ckpt.get("config") if isinstance(ckpt, dict) else None
    if not isinstance(config, dict):
        return []
    return [o for o in config_overrides(config) if _key(o) not in FROM_CHECKPOINT_SKIP]


def _added(argv, stored):
    """The ``stored`` overrides argv does not give itself: a key or group it sets, or the keys of a group it chooses."""
    given = {p.key_or_group for p in map(_parsed, argv) if p is not None}
    groups = {g for g in given if "." not in g}
    return [
        o for o in stored if _key(o) not in given and _key(o).split(".")[0] not in groups and _key(o) not in ONE_SHOT
    ]


def with_stored_overrides(argv):
    """(argv, where the added overrides come from or None): a run to resume gets its settings first, so that the
    run dir or the checkpoint alone resumes it; what argv gives itself wins. Multiruns are left as they are.

    A run dir (``hydra.run.dir=<dir>`` or ``trainer.resume=<dir>``) holding checkpoints/last.pt gets the overrides
    it was launched with (its .hydra/overrides.yaml), or, without that record, the config stored in its last.pt;
    ``trainer.resume=<file>`` gets the config stored in that checkpoint, unless argv names a preset (experiment=).
    ONE_SHOT overrides are never added.
    """
    if "-m" in argv or "--multirun" in argv:
        return argv, None
    for key in ("hydra.run.dir", "trainer.resume"):
        run_dir = _given(argv, key)
        last = os.path.join(run_dir or "", "checkpoints", "last.pt")
        if run_dir and os.path.isfile(last):
            record = os.path.join(run_dir, ".hydra", "overrides.yaml")
            if os.path.isfile(record):
                added = _added(argv, [str(o) for o in OmegaConf.load(record)])
                return added + list(argv), f"the run dir's recorded overrides: {' '.join(added)}" if added else None
            return _from_checkpoint(argv, last)
    resume = _given(argv, "trainer.resume")
    if resume and os.path.isfile(resume):
        return _from_checkpoint(argv, resume)
    return argv, None


def _from_checkpoint(argv, path):
    if _given(argv, "experiment") is not None:
        return argv, None  # the command line names its preset: composed as given, compared with the checkpoint
    added = _added(argv, _checkpoint_overrides(path))
    if not added:
        return argv, None
    choices = [o for o in added if "." not in _key(o)]
    return added + list(argv), (
        f"the config stored in {path} ({' '.join(choices)} and {len(added) - len(choices)} values; "
        f"the command line's own win)"
    )


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


class Launch:
    """What a launch found in its run dir: enough to remove what a failed first launch created, and nothing else.

    Hydra creates the run dir and writes .hydra/ before the task starts; the task calls ``started`` with it.
    """

    def __init__(self, argv):
        given = _given(argv, "hydra.run.dir")
        self.given = os.path.abspath(given) if given else None
        self.run_dir = self.given
        self.before = None  # the run dir's entries before the launch; None: it did not exist
        self.parents = None  # the folders above it that the launch created, deepest first; None: Hydra's outputs/
        if self.given:
            self.before = set(os.listdir(self.given)) if os.path.isdir(self.given) else None
            self.parents = _missing_parents(os.path.dirname(self.given))

    def started(self, run_dir):
        """The run dir Hydra chose and created; one it chose itself (outputs/<date>/<time>) holding only Hydra's
        .hydra/ is new."""
        self.run_dir = os.path.abspath(run_dir)
        if self.given and os.path.realpath(self.given) != os.path.realpath(self.run_dir):
            self.given, self.parents = None, None  # not the dir it names (an interpolation): judged as Hydra's own
        if not self.given:
            entries = set(os.listdir(self.run_dir))
            self.before = None if entries <= {".hydra"} else entries

    def remove_created(self):
        """Remove what this failed launch created in and above its run dir: the whole dir when it is new. Nothing is
        removed once the run wrote its config.yaml (it passed every check) or while another run holds the lock."""
        run_dir = self.run_dir
        if not run_dir or not os.path.isdir(run_dir) or os.path.exists(os.path.join(run_dir, "config.yaml")):
            return
        with _unlocked(run_dir) as free:
            if not free:
                return
            if self.before is None:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                for name in set(os.listdir(run_dir)) - self.before:
                    path = os.path.join(run_dir, name)
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        if self.before is None:
            _remove_empty(self.parents, os.path.dirname(run_dir))

    def remove_own_empty(self):
        """Under torchrun, a rank > 0's own run dir (Hydra's outputs/<date>/<time> of its second; rank 0's is
        used by all) when left empty: it holds nothing, so nothing of another process is removed."""
        if self.run_dir and not self.given and self.before is None:
            _remove_empty(None, self.run_dir)


def _missing_parents(folder):
    """The folders of ``folder``'s path that do not exist, deepest first."""
    missing = []
    while folder and not os.path.exists(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _remove_empty(parents, first):
    """Remove the empty folders among ``parents`` (deepest first); None: those from ``first`` up to the current
    directory (Hydra's outputs/<date>/ of a run dir it chose)."""
    if parents is None:
        parents, cwd = [], os.getcwd()
        while first.startswith(cwd + os.sep):
            parents.append(first)
            first = os.path.dirname(first)
    for folder in parents:
        try:
            os.rmdir(folder)
        except OSError:
            return  # not empty: it holds something else


@contextlib.contextmanager
def _unlocked(run_dir):
    """True while this process holds the run dir's lock, taken for the block; False when another process holds it."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDWR)
    except OSError:
        yield True  # no lock file: no run has started here
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield True
    except BlockingIOError:
        yield False
    finally:
        os.close(fd)


@contextlib.contextmanager
def keep_run_dir_on_failure(argv):
    """Around a launch; yields its Launch. When the launch fails (an exception or a non-zero exit) before the run
    wrote its config.yaml, an existing run dir's .hydra/ files (which Hydra rewrites before the run starts) are put
    back as they were, and what a first launch created (the run dir, Hydra's folders above it) is removed.

    A run that got as far as writing config.yaml has passed every check: its .hydra/ describes it and stays.
    """
    launch = Launch(argv)
    main = env_rank() == 0
    saved = _snapshot(launch.given) if launch.given and main and os.path.isdir(launch.given) else None
    try:
        yield launch
    except BaseException as e:
        failed = not (isinstance(e, SystemExit) and e.code in (0, None))
        if failed and saved is not None:
            stat = os.stat(os.path.join(launch.given, "config.yaml"))
            if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == saved[0]:
                _restore_hydra(launch.given, saved[1])
        elif failed and main:
            launch.remove_created()
        elif failed:
            launch.remove_own_empty()
        raise


def check_run_dir_given(argv):
    """ConfigError for a run dir given as an empty path (an unset shell variable, ``hydra.run.dir=$RUN``): Hydra would
    write the run into the current directory."""
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        values = [p.value() for p in map(_parsed, argv) if p is not None and p.key_or_group == key]
        if values and isinstance(values[-1], str) and not values[-1].strip():
            raise ConfigError(
                f"{key} is empty (an unset shell variable?), so the run would be written into the current "
                f"directory {os.getcwd()}; give the run dir, e.g. {key}=runs/my_run, or leave {key} out "
                f"(outputs/<date>/<time>)."
            )


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
