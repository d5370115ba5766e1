"""Train an AdderNet (or its CNN twin): ``python train.py [experiment=<preset>] [key=value ...]``.

Thin Hydra wrapper around addernet.engine.train; see configs/train.yaml and docs/training.md.
Under torchrun (scripts/dist_train.sh) every rank uses rank 0's run dir and only rank 0 writes.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from addernet.distributed import env_rank
from addernet.engine import train
from addernet.engine.entry_checks import exit_on_bad_command_line, groups_listing
from addernet.engine.rundir import keep_run_dir_on_failure, with_stored_overrides
from addernet.engine.sweep import record_failure, sweep_exit_code
from addernet.errors import AdderNetError, Preempted

# hydra.output_subdir is ${rank0_only:.hydra}: ranks > 0 write no .hydra/ folder.
OmegaConf.register_new_resolver("rank0_only", lambda value: value if env_rank() == 0 else None, replace=True)
OmegaConf.register_new_resolver("entry_groups", groups_listing, replace=True)  # --help: train.py's groups only


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg):
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


if __name__ == "__main__":
    sys.argv[1:], stored = with_stored_overrides(sys.argv[1:])
    if stored:
        print(f"train.py: resuming with the run dir's recorded overrides: {' '.join(stored)}", file=sys.stderr)
    exit_on_bad_command_line(sys.argv[1:], "train", "train.py")
    with keep_run_dir_on_failure(sys.argv[1:]):
        main()
    sys.exit(sweep_exit_code())
