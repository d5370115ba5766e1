"""The logger group: MLflow (local file store) and W&B (offline) runs hold the same scalars as metrics.jsonl,
the hparams and the resolved config; TensorBoard stays the default. Skipped when the extra is not installed."""

import json
import subprocess
import sys

import pytest
from packaging.version import Version

from addernet.engine import train
from addernet.engine.config import check_config
from addernet.errors import ConfigError

from helpers import TINY_LENET, compose


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a whole run logged to MLflow's file store
def test_mlflow_file_store_run_has_the_scalars_params_and_config(tmp_path):
    pytest.importorskip("mlflow", reason="pip install mlflow-skinny")
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    train(compose(TINY_LENET + ["trainer.epochs=2", "logger=[tensorboard,mlflow]"]), str(run))
    assert (run / "tensorboard").is_dir()
    client = MlflowClient(tracking_uri=f"file:{run / 'mlruns'}")
    [found] = client.search_runs([client.get_experiment_by_name("addernet").experiment_id])
    records = _records(run)
    for tag, key in (("val/top1", "val_top1"), ("train/loss", "train_loss"), ("watch/lr", "lr")):
        history = sorted(client.get_metric_history(found.info.run_id, tag), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(r["epoch"], pytest.approx(r[key])) for r in records]
    assert found.data.params["model"] == "lenet5_bn" and found.data.params["epochs"] == "2"
    assert found.data.metrics["val_summary/best_top1"] == pytest.approx(max(r["val_top1"] for r in records))
    config = client.download_artifacts(found.info.run_id, "config.yaml", str(tmp_path))
    assert "lenet5_bn" in open(config).read()


def wandb_records(path):
    """The records of an offline W&B run file (run-*.wandb), as W&B's own reader prints them: ``wandb leet
    inspect --json`` writes one JSON object per record of the transaction log."""
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.slow
def test_wandb_offline_run_has_the_scalars_and_config(tmp_path):  # starts W&B's service process
    wandb = pytest.importorskip("wandb", reason="pip install wandb")
    if Version(wandb.__version__) < Version("0.31"):
        pytest.skip("reading the run file needs wandb >= 0.31 (wandb leet inspect --json)")
    run = tmp_path / "run"
    train(compose(TINY_LENET + ["trainer.epochs=2", "logger=wandb"]), str(run))
    wandb.teardown()  # the W&B service writes the run file asynchronously: stop it so the file is complete
    assert not (run / "tensorboard").exists()  # logger=wandb alone: no TensorBoard files
    [path] = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    records = wandb_records(path)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert len(history) == len(_records(run)), [r["type"] for r in records]
    for got, expected in zip(history, _records(run)):
        assert got["_step"] == expected["epoch"]
        for tag, key in (("val/top1", "val_top1"), ("train/loss", "train_loss"), ("watch/lr", "lr")):
            assert got[tag] == pytest.approx(expected[key])
    summary = {k: v for r in records if r["type"] == "summary" for k, v in r["summary"]["update"].items()}
    assert summary["val_summary/final_top1"] == pytest.approx(_records(run)[-1]["val_top1"])
    [config] = [r["run"]["config"]["update"] for r in records if r["type"] == "run"]
    assert config["model"]["name"] == "lenet5_bn" and config["hparams"]["epochs"] == 2


def test_an_unknown_logger_is_a_config_error():
    cfg = compose(TINY_LENET + ["trainer.epochs=2"])
    cfg.logger = {"neptune": {}}
    with pytest.raises(ConfigError, match="unknown logger 'neptune'"):
        check_config(cfg)
