"""The engine: config checks, the epoch loop, the fit driver, resume state, run outputs, meters, evaluation.

config.py    check_config: a training config's rules (a task checks its own when built), the typed Settings; the device
evaluate.py  evaluation over a sharded loader
loop.py      one epoch of training steps, with host checks only every trainer.log_every steps
step.py      one optimizer step: mixing, micro-batches, clipping, the step, the weight average
parts.py     the run's parts, built in one phase from the checked config (the run dir's writes last), frozen
fit.py       ``train(cfg, run_dir)``: guards the run dir, builds the parts, runs the epochs, tracks the best
rundir.py    the run dir's lock; a failed launch leaves it as it was; the run dir alone resumes a run
resume.py    loop position, RNG states, the SIGTERM flag, restoring from last.pt (returns what the driver applies)
outputs.py   train.log, metrics.jsonl, TensorBoard events and hparams (rank 0)
meters.py    exact running sums of loss, accuracy and named loss parts
eval_run.py  ``test.py``'s logic: stored-config merge, checkpoint loading (also for the scripts), the report
"""

from ..errors import ConfigError, NonFiniteLoss, Preempted
from ..models import model_from_config
from .config import check_config, check_eval_config, device_type
from .evaluate import evaluate
from .fit import train
from .meters import MetricSums, topk_correct

__all__ = [
    "ConfigError",
    "MetricSums",
    "NonFiniteLoss",
    "Preempted",
    "check_config",
    "check_eval_config",
    "device_type",
    "evaluate",
    "model_from_config",
    "topk_correct",
    "train",
]
