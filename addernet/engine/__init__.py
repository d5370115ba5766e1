"""The engine: config checks, the epoch loop, the fit driver, resume, the run dir, outputs, meters, evaluation.

config.py      check_config: a training config checked once, returning the typed config (the schema's classes)
loop.py        train_one_epoch: the batch loop (to device, step, NaN watch, stop vote, log line, mid-epoch resume)
step.py        one optimizer step: mixing, micro-batches, clipping, the step, the weight average
parts.py       the run's parts, built in one phase from the checked config (the run dir's writes last), frozen
fit.py         ``train(cfg, run_dir)``: guards the run dir, builds the parts; Run.fit runs the epochs, tracks the best
resume.py      which checkpoint to resume, which settings may change, loop position, RNG states, SIGTERM, restoring
rundir.py      the run dir's lock and guards; the run dir alone resumes a run; output files never replace inputs
outputs.py     train.log, metrics.jsonl, run.json, config.yaml, TensorBoard events and hparams (rank 0)
trackers.py    experiment trackers next to TensorBoard (the ``logger`` group: MLflow, W&B)
meters.py      exact running sums of loss, accuracy and named loss parts
ema.py         trainer.ema_decay: the exponential moving average of the model
precise_bn.py  trainer.precise_bn: BatchNorm statistics re-estimated before validation
allocator.py   trainer.retain_freed_memory: glibc keeps the memory a step frees for the next step
evaluation.py  ``evaluate`` over a sharded loader; ``test.py``'s logic: stored-config merge, checkpoint loading
               (also for the scripts), the report
sweep.py       failed jobs of a Hydra multirun: recorded, the sweep goes on
"""

from ..errors import ConfigError, NonFiniteLoss, Preempted
from ..models import model_from_config
from .config import check_config, check_eval_config, device_type
from .evaluation import evaluate
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
