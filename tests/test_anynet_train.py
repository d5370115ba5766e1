"""Training and test.py's evaluation with model=torchvision and model=vit (adder and twin), a resume, and torchrun.

The runs are in-process (the engine's train() and test.py's evaluate_checkpoint()); torchrun starts processes.
"""

import json
import sys

import pytest

from addernet.engine import train
from addernet.engine.evaluation import evaluate_checkpoint
from addernet.models import model_label

from helpers import TINY_LENET, child_env, compose, run_train

pytestmark = pytest.mark.slow  # training runs of a full-size torchvision ResNet-18, and torchrun

MODELS = {
    "torchvision": ["model=torchvision", "model.arch=resnet18", "data.image_size=32"],
    "vit": ["model=vit", "model.width=16", "model.depth=1", "model.heads=2", "data.image_size=16"],
}


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("layer", ["adder", "conv"])
def test_train_one_epoch_then_test_reproduces_the_validation(tmp_path, model, layer, one_thread):
    run = tmp_path / "run"
    train(
        compose([*TINY_LENET, *MODELS[model], f"model.layer={layer}", "trainer.log_every=1", "trainer.epochs=1"]),
        str(run),
    )
    (record,) = _metrics(run)
    log = (run / "train.log").read_text()
    assert f"model {model_label(compose([*MODELS[model], f'model.layer={layer}']).model)}:" in log
    args = [f"checkpoint={run / 'checkpoints' / 'best.pt'}", "trainer.progress=false"]
    result = evaluate_checkpoint(compose(args, config_name="test"), args)
    # test.py rebuilds the model from the stored config (model.arch / sizes included) and scores what training did
    # (determinism on one machine: the same weights and images, scored twice)
    assert result["n"] == 8
    assert result["top1"] == pytest.approx(record["val_top1"]) and result["loss"] == pytest.approx(record["val_loss"])


@pytest.mark.slow
def test_vit_adder_run_resumes_and_extends(tmp_path, one_thread):
    run = tmp_path / "run"
    args = [*TINY_LENET, *MODELS["vit"], "model.layer=adder", "trainer.log_every=1"]
    train(compose([*args, "trainer.epochs=1"]), str(run))
    first = _metrics(run)
    train(compose([*args, "trainer.epochs=2"]), str(run))
    log = (run / "train.log").read_text()
    assert "resumed from" in log and "1 epoch(s) done" in log
    records = _metrics(run)
    assert [r["epoch"] for r in records] == [1, 2] and records[0] == first[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_processes_adder_torchvision(tmp_path):
    run = tmp_path / "job"
    proc = run_train(
        [*TINY_LENET, *MODELS["torchvision"], "trainer.log_every=1", "trainer.epochs=1"],
        script=("bash", "scripts/dist_train.sh", "2"),
        timeout=300,
        env=child_env(PYTHON=sys.executable, RUN_DIR=str(run)),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = _metrics(run)
    assert record["epoch"] == 1 and (run / "checkpoints" / "best.pt").exists()
    assert "2 process(es)" in (run / "train.log").read_text()
