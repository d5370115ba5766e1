"""Failed jobs of a Hydra multirun (``-m``): recorded, the sweep goes on, and its exit code says so.

An entry point that catches a job's error calls :func:`record_failure`: in a multirun it writes the
message and exit code to ``<job dir>/error.txt`` and appends them to ``<sweep dir>/failures.log``, and
the entry point returns instead of exiting, so the next job runs; after the sweep it exits with
:func:`sweep_exit_code` (the largest failed job's code, 0 when all succeeded). Outside a multirun it
does nothing and the entry point exits at once as usual.

:class:`SweepOutcome`, a Hydra callback (``hydra.callbacks`` of configs/train.yaml and test.yaml), makes
this hold for every launcher: a job that dies of any other exception is recorded the same way (exit
code 1), and at the end of the sweep the launching process reads the lines its jobs appended to
failures.log, so a launcher that runs jobs in other processes (submitit) still exits non-zero.
"""

import os
import re

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

FAILED = []  # exit codes of this process's (or, after the sweep, its jobs') failed multirun jobs


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


class SweepOutcome(Callback):
    """Records jobs that raised, and collects the failures of jobs run in other processes (see the module)."""

    def __init__(self):
        self.log, self.seen = None, 0

    def on_multirun_start(self, config, **kwargs):
        self.log = os.path.join(str(config.hydra.sweep.dir), "failures.log")
        self.seen = os.path.getsize(self.log) if os.path.isfile(self.log) else 0  # an earlier sweep's lines

    def on_job_end(self, config, job_return, **kwargs):
        if job_return.status == JobStatus.FAILED:
            error = job_return._return_value  # the exception; .return_value would raise it
            record_failure(f"{type(error).__name__}: {error}", 1)

    def on_multirun_end(self, config, **kwargs):
        if self.log and os.path.isfile(self.log):
            with open(self.log) as f:
                f.seek(self.seen)
                FAILED.extend(int(code) for code in re.findall(r": exit code (\d+): ", f.read()))
