"""Evaluate a checkpoint: ``python test.py checkpoint=PATH [data=...] [data.root=...] [model=...]``.

Thin Hydra wrapper around addernet.engine.eval_run (see docs/evaluation.md). Our checkpoints rebuild
their model and data from the stored config (command-line overrides win); official AdderNet
checkpoints take them from the command line and configs/test.yaml. The last line printed is one
JSON object {"top1", "top5", "loss", "n", "images_per_s"} (accuracies in percent). CPU or GPU, one
process or torchrun.
"""

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf.errors import OmegaConfBaseException

from addernet import distributed as dist
from addernet.engine.entry_checks import exit_on_bad_command_line
from addernet.engine.eval_run import evaluate_checkpoint, implied_data_choice, report
from addernet.engine.outputs import setup_logging
from addernet.engine.sweep import record_failure, sweep_exit_code
from addernet.errors import AdderNetError

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
IMPLIED = implied_data_choice(sys.argv[1:], CONFIGS) if __name__ == "__main__" else None


@hydra.main(version_base="1.3", config_path="configs", config_name="test")
def main(cfg):
    restore_logging = setup_logging(None, dist.env_rank() == 0)  # [addernet.data] lines, not Hydra's [HYDRA]
    try:
        result = evaluate_checkpoint(cfg, [o for o in HydraConfig.get().overrides.task if o != IMPLIED])
        if dist.is_main():
            report(result, cfg.results_file)
    except (AdderNetError, OmegaConfBaseException) as e:
        print(f"test.py: error: {e}", file=sys.stderr)
        if not record_failure(f"test.py: error: {e}", getattr(e, "exit_code", 2)):
            sys.exit(getattr(e, "exit_code", 2))  # a multirun records a failed job and goes on
    except KeyboardInterrupt:
        print("test.py: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        restore_logging()
        dist.cleanup()


if __name__ == "__main__":
    exit_on_bad_command_line(sys.argv[1:] + ([IMPLIED] if IMPLIED else []), "test", "test.py", run_dir=False)
    if IMPLIED:
        sys.argv.append(IMPLIED)
    main()
    sys.exit(sweep_exit_code())
