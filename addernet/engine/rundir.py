"""Guards of the run directory: one run at a time, no stale temporaries, every failure in train.log.

The lock is a kernel file lock (``fcntl.flock``) on ``<run dir>/.lock``, held by rank 0 for the life
of the run: the kernel drops it when the process exits in any way (kill -9 included), so a crashed
run never leaves a stale lock behind. The file itself stays (removing it would let two runs lock two
different files of the same name); it holds the pid of the last run that locked it.
"""

import fcntl
import glob
import os
import time

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
