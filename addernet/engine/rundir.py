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
    return ConfigError(f"cannot write to the run dir {run_dir} ({e.strerror or e}); make it writable or choose "
                       f"another one with hydra.run.dir=/path/to/run.")


def lock_run_dir(run_dir):
    """The open ``<run dir>/.lock``, exclusively locked (closing it or exiting releases the lock).

    RunDirBusy at once when another run holds it; ConfigError when the run dir is not writable.
    """
    path = os.path.join(run_dir, LOCK)
    try:
        os.makedirs(run_dir, exist_ok=True)
        f = open(path, "a+")
    except OSError as e:
        raise _unwritable(run_dir, e) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise RunDirBusy(f"the run dir {run_dir} is in use by another training run (pid {holder} holds {path}); "
                         f"wait for it to finish, or start this run in another dir with hydra.run.dir=...") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
    except OSError as e:
        f.close()
        raise _unwritable(run_dir, e) from None
    return f


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
