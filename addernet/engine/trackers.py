"""Experiment trackers next to TensorBoard, chosen by the ``logger`` config group (rank 0 alone logs).

``logger=tensorboard`` (default), ``logger=mlflow``, ``logger=wandb`` or a list (``logger=[tensorboard,mlflow]``).
MLflow (optional extra ``mlflow-skinny``) writes a local file store (``<run dir>/mlruns`` unless
logger.mlflow.tracking_uri says otherwise); Weights & Biases (optional extra ``wandb``) runs offline unless
logger.wandb.mode=online. Both get the same scalars as TensorBoard (same names, x axis = epoch), the hparams
and the resolved config; a resumed run continues its MLflow run (found by its run-dir tag) and its W&B run
(its id is derived from the run dir).
"""

import hashlib
import importlib
import os

from ..errors import ConfigError

TRACKERS = ("tensorboard", "mlflow", "wandb")
PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}  # logger: (module, pip package)


def selected(cfg):
    """The tracker names the ``logger`` group selects (tensorboard alone when the group is absent)."""
    node = cfg.get("logger")
    names = list(node.keys()) if node is not None else ["tensorboard"]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ConfigError(
            f"unknown logger {unknown[0]!r}; choose logger=<one of {', '.join(TRACKERS)}> or a list, "
            f"e.g. logger=[tensorboard,mlflow]."
        )
    return names


def _require(name):
    """The module logger=``name`` needs; ConfigError naming the pip package when it is not installed."""
    module, package = PACKAGES[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"logger={name} needs the optional package {package}: pip install {package} (or drop it from logger=)."
        ) from None


def require_trackers(cfg):
    """ConfigError when a tracker cfg.logger selects is not installed (checked before the run dir is written)."""
    for name in selected(cfg):
        if name in PACKAGES:
            _require(name)


class MLflowTracker:
    def __init__(self, node, run_dir, config, hparams):
        self.mlflow = mlflow = _require("mlflow")
        uri = node.tracking_uri or "file:" + os.path.join(run_dir, "mlruns")
        if uri.startswith("file:"):  # MLflow >= 3.x asks for this opt-in to keep using a plain file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        experiment = mlflow.set_experiment(node.experiment)
        tag = os.path.abspath(run_dir)
        found = mlflow.search_runs(
            [experiment.experiment_id], filter_string=f"tags.run_dir = '{tag}'", output_format="list"
        )
        self.run = mlflow.start_run(
            run_id=found[0].info.run_id if found else None,
            run_name=None if found else os.path.basename(run_dir),
            tags={"run_dir": tag},
        )
        if not found:
            mlflow.log_params(hparams)
            mlflow.log_dict(config, "config.yaml")

    def log(self, scalars, step):
        self.mlflow.log_metrics(scalars, step=step)

    def close(self, metrics=None):
        if metrics:
            self.mlflow.log_metrics(metrics)
        self.mlflow.end_run()


class WandbTracker:
    def __init__(self, node, run_dir, config, hparams):
        wandb = _require("wandb")
        run_id = hashlib.sha1(os.path.abspath(run_dir).encode()).hexdigest()[:16]
        self.run = wandb.init(
            project=node.project,
            mode=node.mode,
            dir=run_dir,
            id=run_id,
            resume="allow",
            name=os.path.basename(run_dir),
            config={"hparams": hparams, **config},
        )

    def log(self, scalars, step):
        self.run.log(scalars, step=step)

    def close(self, metrics=None):
        if metrics:
            self.run.summary.update(metrics)
        self.run.finish()


def build_trackers(cfg, run_dir, config, hparams):
    """The MLflow / W&B trackers selected by cfg.logger (TensorBoard is RunOutputs' own writer)."""
    classes = {"mlflow": MLflowTracker, "wandb": WandbTracker}
    return [classes[n](cfg.logger[n], run_dir, config, hparams) for n in selected(cfg) if n in classes]
