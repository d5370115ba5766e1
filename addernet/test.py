"""Evaluate a checkpoint: ``python -m addernet.test checkpoint=PATH [data=...] [data.root=...] [model=...]``.

The repository's test.py runs this (docs/evaluation.md). Our checkpoints rebuild their model and data from
the stored config, the command line on top; official AdderNet checkpoints take them from the command line
(default ResNet-20 AdderNet on CIFAR-10). The last line printed is one JSON object
{"top1", "top5", "loss", "n", "images_per_s", "weights"} (accuracies in percent). CPU or GPU, one process
or torchrun.
"""

import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf.errors import OmegaConfBaseException

from . import distributed as dist
from .config.entry import run_entry
from .engine.evaluation import evaluate_checkpoint, report
from .engine.outputs import setup_logging
from .engine.sweep import record_failure, sweep_exit_code
from .errors import AdderNetError


def task(cfg):
    restore_logging = setup_logging(None, dist.env_rank() == 0)  # [addernet.data] lines, not Hydra's [HYDRA]
    try:
        result = evaluate_checkpoint(cfg, HydraConfig.get().overrides.task)
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


def main():
    run_entry("test.py", "test", task)
    sys.exit(sweep_exit_code())


if __name__ == "__main__":
    main()
