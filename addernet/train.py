"""Train an AdderNet (or its CNN twin): ``python -m addernet.train [experiment=<preset>] [key=value ...]``.

The repository's train.py runs this. See configs/train.yaml and docs/training.md. Under torchrun
(scripts/dist_train.sh) every rank uses rank 0's run dir and only rank 0 writes.
"""

import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config.entry import run_entry
from .distributed import env_rank
from .engine import train
from .engine.rundir import keep_run_dir_on_failure, with_stored_overrides
from .engine.sweep import record_failure, sweep_exit_code
from .errors import AdderNetError, Preempted

# hydra.output_subdir is ${rank0_only:.hydra}: ranks > 0 write no .hydra/ folder.
OmegaConf.register_new_resolver("rank0_only", lambda value: value if env_rank() == 0 else None, replace=True)


def task(cfg):
    try:
        return train(cfg, HydraConfig.get().runtime.output_dir)["best_top1"]
    except (AdderNetError, OmegaConfBaseException) as e:
        message = f"train.py: {'' if isinstance(e, Preempted) else 'error: '}{e}"
        print(message, file=sys.stderr)
        if isinstance(e, Preempted) or not record_failure(message, getattr(e, "exit_code", 2)):
            sys.exit(getattr(e, "exit_code", 2))  # a multirun records a failed job and goes on
    except KeyboardInterrupt:  # a second Ctrl-C (the first one saves and exits 130 through Interrupted)
        print(
            "train.py: interrupted twice: stopped at once without saving the current epoch; "
            "checkpoints/last.pt (if any) is intact.",
            file=sys.stderr,
        )
        sys.exit(130)


def main():
    sys.argv[1:], stored = with_stored_overrides(sys.argv[1:])
    if stored:
        print(f"train.py: resuming with the run dir's recorded overrides: {' '.join(stored)}", file=sys.stderr)
    with keep_run_dir_on_failure(sys.argv[1:]):
        run_entry("train.py", "train", task)
    sys.exit(sweep_exit_code())


if __name__ == "__main__":
    main()
