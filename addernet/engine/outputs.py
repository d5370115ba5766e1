"""What a run writes (rank 0 only): train.log, metrics.jsonl, TensorBoard events and hparams.

TensorBoard shows tag groups alphabetically across all runs, so the curves a user opens it for (``train/``,
``val/``: loss and accuracy) are the first groups; the run's summary (``val_summary/``), LR and throughput
(``watch/``) and the per-layer diagnostics (``weights/``: one adaptive-LR curve and one weight histogram per
adder layer, in a run of their own, ``tensorboard/diagnostics``, hidden with one click) sort after them.

Crash-safe by construction: metrics.jsonl is rewritten from the checkpoint's history when a run
resumes, and the TensorBoard writer purges events after the resumed epoch, so a replayed epoch
never appears twice.
"""

import json
import logging
import math
import os
import sys

from omegaconf import OmegaConf

from ..ops import ADDER_MODULES

RECORD_SCALARS = (
    ("train/loss", "train_loss"),
    ("train/top1", "train_top1"),
    ("val/loss", "val_loss"),
    ("val/top1", "val_top1"),
    ("val/top5", "val_top5"),
    ("watch/lr", "lr"),
    ("watch/images_per_s", "images_per_s"),
)
BASE_KEYS = {key for _, key in RECORD_SCALARS} | {"epoch", "val_n", "epoch_seconds", "val_images_per_s"}


def setup_logging(run_dir, main):
    """Log to the console on every rank (warnings only off rank 0) and to train.log on rank 0 (none when run_dir
    is None: test.py), each line labelled with its logger's name; returns undo."""
    logger = logging.getLogger("addernet")
    handlers = [logging.StreamHandler(sys.stderr)]
    if main and run_dir is not None:
        handlers.append(logging.FileHandler(os.path.join(run_dir, "train.log")))
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")
    for h in handlers:
        h.setFormatter(fmt)
        logger.addHandler(h)
    old = (logger.level, logger.propagate)
    logger.setLevel(logging.INFO if main else logging.WARNING)
    logger.propagate = False

    def restore():
        for h in handlers:
            logger.removeHandler(h)
            h.close()
        logger.setLevel(old[0])
        logger.propagate = old[1]

    return restore


def finite_or_null(value):
    """``value`` with every NaN/inf float replaced by None, in nested dicts and lists (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def json_line(record):
    """Strict JSON of ``record`` (NaN/inf written as null, never as a bare NaN), no newline."""
    return json.dumps(finite_or_null(record), allow_nan=False)


def _write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_facts(run_dir, facts):
    """<run dir>/run.json: what the run was, as built (device, processes, image counts, data placement,
    compilation), for scripts/summarize_runs.py; rewritten by every (resumed) start, atomically."""
    _write_atomically(os.path.join(run_dir, "run.json"), json_line(facts) + "\n")


def write_config(run_dir, cfg):
    """<run dir>/config.yaml: the resolved config of the run, rewritten atomically by every (resumed) start."""
    _write_atomically(os.path.join(run_dir, "config.yaml"), OmegaConf.to_yaml(cfg, resolve=True))


def extra_keys(record):
    """The record's task-specific keys (loss parts, a teacher's metrics), in a stable order."""
    return sorted(k for k in record if k not in BASE_KEYS)


class RunOutputs:
    """metrics.jsonl + TensorBoard of one run dir; every method is a no-op off rank 0."""

    def __init__(self, run_dir, main, resumed_epoch=None, tensorboard=True, trackers=()):
        self.main, self.metrics = main, os.path.join(run_dir, "metrics.jsonl")
        self.writer = self.diagnostics = None
        self.trackers = list(trackers) if main else []
        if main and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resumed_epoch + 1 if resumed_epoch is not None else None
            self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=purge)
            self.diagnostics = SummaryWriter(os.path.join(run_dir, "tensorboard", "diagnostics"), purge_step=purge)

    def rewrite_metrics(self, history):
        """metrics.jsonl from the checkpoint's history (atomic), so a replayed epoch is not doubled."""
        if not self.main:
            return
        tmp = self.metrics + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json_line(r) + "\n" for r in history)
        os.replace(tmp, self.metrics)

    def write_epoch(self, record, alphas, model, histograms):
        """One epoch's line in metrics.jsonl and its TensorBoard points (x axis = epoch, 1-based), flushed."""
        if not self.main:
            return
        step, w = record["epoch"], self.writer
        scalars = {tag: record[key] for tag, key in RECORD_SCALARS}
        for key in extra_keys(record):  # train_<part> -> train/<part>, teacher_val_top1 -> teacher_val/top1
            prefix, _, name = key.rpartition("_") if not key.startswith("train_") else ("train", "", key[6:])
            scalars[f"{prefix}/{name}"] = record[key]
        layers = {f"weights/adaptive_lr/{name}": alpha for name, alpha in alphas.items()}
        for tracker in self.trackers:  # MLflow / W&B: the same scalars (addernet/engine/trackers.py)
            tracker.log({**scalars, **layers}, step)
        if w is not None:
            for tag, value in scalars.items():
                w.add_scalar(tag, value, step)
            for tag, value in layers.items():
                self.diagnostics.add_scalar(tag, value, step)
            if histograms:
                for name, module in model.named_modules():
                    if isinstance(module, ADDER_MODULES):
                        self.diagnostics.add_histogram(f"weights/{name}", module.weight.detach().float().cpu(), step)
            w.flush()
            self.diagnostics.flush()
        with open(self.metrics, "a") as f:
            f.write(json_line(record) + "\n")

    def close(self, hparams=None, metrics=None):
        if self.writer is not None:
            if hparams is not None:
                self.writer.add_hparams(hparams, metrics, run_name=".")  # the run's own dir: one run in TensorBoard
            self.writer.close()
            self.diagnostics.close()
            self.writer = self.diagnostics = None
        for tracker in self.trackers:
            tracker.close(metrics)
        self.trackers = []
