"""Every error a user can cause or fix, under one base class that train.py and test.py catch.

Each subclass carries the process exit code its entry point uses: 2 for a mistake in the command or
its inputs, 3 for a training run that diverged, 4 when another torchrun process stalled or died, 143
for a pre-empted run (128 + SIGTERM, what schedulers expect), 130 for a run stopped by Ctrl-C (128 +
SIGINT). The message always says what was wrong and what to do.
"""

import contextlib
import sys


class AdderNetError(Exception):
    """Base of all user-facing errors; ``exit_code`` is what train.py / test.py exit with."""

    exit_code = 2


class ConfigError(AdderNetError, ValueError):
    """A config value is invalid; the message names the key and the fix."""


class DataError(AdderNetError, RuntimeError):
    """The dataset cannot be built: missing files, wrong layout or a bad data.* setting."""


class CheckpointError(AdderNetError, RuntimeError):
    """A checkpoint is missing, truncated/corrupt, of the wrong kind, or holds objects unsafe to load."""


class BuildError(AdderNetError, RuntimeError):
    """The C adder kernel could not be compiled or loaded (no compiler, compile error, bad platform)."""


class NonFiniteLoss(AdderNetError, RuntimeError):
    """The loss, the validation loss or the model state became NaN/inf; nothing non-finite is ever saved."""

    exit_code = 3


class PeerFailure(AdderNetError, RuntimeError):
    """Under torchrun another process stalled or died: a collective timed out (trainer.dist_timeout) or broke."""

    exit_code = 4


class Preempted(AdderNetError, RuntimeError):
    """SIGTERM arrived: last.pt was saved after the current step; the run exits non-zero."""

    exit_code = 143


class Interrupted(Preempted):
    """SIGINT (Ctrl-C) arrived: handled like SIGTERM (last.pt saved), exit code 128 + SIGINT."""

    exit_code = 130


@contextlib.contextmanager
def reported(prog, errors=()):
    """What an entry point does with a user's error raised in the block: ``<prog>: error: <message>`` on
    stderr and the error's exit code (2 for ``errors``, further exception types to treat the same way)."""
    try:
        yield
    except (AdderNetError, *errors) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
