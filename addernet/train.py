"""Train an AdderNet (or its CNN twin): ``python -m addernet.train [experiment=<preset>] [key=value ...]``.

The repository's train.py runs this. See configs/train.yaml and docs/training.md. Under torchrun
(scripts/dist_train.sh) every rank uses rank 0's run dir and only rank 0 writes.
"""

import functools
import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config.entry import run_entry
from .distributed import env_rank
from .engine import train
from .engine.rundir import check_run_dir_given, drop_one_shot, keep_run_dir_on_failure, with_stored_overrides
from .engine.sweep import record_failure, sweep_exit_code
from .errors import AdderNetError, Preempted, reported

# hydra.output_subdir is ${rank0_only:.hydra}: ranks > 0 write no .hydra/ folder.
OmegaConf.register_new_resolver("rank0_only", lambda value: value if env_rank() == 0 else None, replace=True)


def task(launch, cfg):
    run_dir = HydraConfig.get().runtime.output_dir
    launch.started(run_dir)
    if env_rank() == 0:
        drop_one_shot(run_dir)  # trainer.resume_override=true is this launch's, never replayed by a later resume
    try:
        return train(cfg, run_dir)["best_top1"]
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
    with reported("train.py"):
        check_run_dir_given(sys.argv[1:])
        sys.argv[1:], source = with_stored_overrides(sys.argv[1:])
    if source:
        print(f"train.py: resuming with {source}", file=sys.stderr)
    with keep_run_dir_on_failure(sys.argv[1:]) as launch:
        run_entry("train.py", "train", functools.partial(task, launch))
    sys.exit(sweep_exit_code())


if __name__ == "__main__":
    main()
