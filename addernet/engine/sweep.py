"""Failed jobs of a Hydra multirun (``-m``): recorded, and the sweep goes on.

An entry point that catches a job's error calls :func:`record_failure`: in a multirun it writes the
message and exit code to ``<job dir>/error.txt`` and appends them to ``<sweep dir>/failures.log``, and
the entry point returns instead of exiting, so the next job runs; after the sweep it exits with
:func:`sweep_exit_code` (the largest failed job's code, 0 when all succeeded). Outside a multirun it
does nothing and the entry point exits at once as usual.
"""

import os

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

FAILED = []  # exit codes of this process's failed multirun jobs


def record_failure(message, code):
    """True (recorded) in a multirun job, else False (the caller exits with ``code``)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    hc = HydraConfig.get()
    line = f"job {hc.job.num} ({' '.join(hc.overrides.task)}): exit code {code}: {message}\n"
    for path, text in (
        (os.path.join(hc.runtime.output_dir, "error.txt"), f"exit code {code}\n{message}\n"),
        (os.path.join(hc.sweep.dir, "failures.log"), line),
    ):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "a") as f:
                f.write(text)
        except OSError:
            pass  # the console already shows the message
    FAILED.append(int(code))
    return True


def sweep_exit_code():
    return max(FAILED, default=0)
