"""train.py and test.py with model=torchvision and model=vit (adder and twin), a resume, and torchrun."""
import json
import sys

import pytest

from helpers import run_train

pytestmark = pytest.mark.slow  # every test starts train.py / test.py / torchrun

FAST = ["data=fake", "data.train_size=16", "data.val_size=8", "data.batch_size=8", "trainer.progress=false",
        "trainer.device=cpu", "trainer.log_every=1"]
MODELS = {
    "torchvision": ["model=torchvision", "model.arch=resnet18", "data.image_size=32"],
    "vit": ["model=vit", "model.width=16", "model.depth=1", "model.heads=2", "data.image_size=16"],
}
ENV = {"OMP_NUM_THREADS": "1"}


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("layer", ["adder", "conv"])
def test_train_one_epoch_then_test_reproduces_the_validation(tmp_path, model, layer):
    run = tmp_path / "run"
    proc = run_train([*MODELS[model], f"model.layer={layer}", *FAST, "trainer.epochs=1", f"hydra.run.dir={run}"],
                     env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = _metrics(run)
    log = (run / "train.log").read_text()
    assert f"model {MODELS[model][0].split('=')[1]} ({layer})" in log
    proc = run_train([f"checkpoint={run / 'checkpoints' / 'best.pt'}"], script=("test.py",), env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # test.py rebuilds the model from the stored config (model.arch / sizes included) and scores what training did
    assert result["n"] == 8
    assert result["top1"] == pytest.approx(record["val_top1"]) and result["loss"] == pytest.approx(record["val_loss"])


@pytest.mark.slow
def test_vit_adder_run_resumes_and_extends(tmp_path):
    run = tmp_path / "run"
    args = [*MODELS["vit"], "model.layer=adder", *FAST, f"hydra.run.dir={run}"]
    assert run_train([*args, "trainer.epochs=1"], env=ENV).returncode == 0
    first = _metrics(run)
    proc = run_train([*args, "trainer.epochs=2"], env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "resumed from" in log and "1 epoch(s) done" in log
    records = _metrics(run)
    assert [r["epoch"] for r in records] == [1, 2] and records[0] == first[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_processes_adder_torchvision(tmp_path):
    run = tmp_path / "job"
    proc = run_train([*MODELS["torchvision"], *FAST, "trainer.epochs=1"], script=("bash", "scripts/dist_train.sh", "2"),
                     timeout=300, env={**ENV, "PYTHON": sys.executable, "RUN_DIR": str(run)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = _metrics(run)
    assert record["epoch"] == 1 and (run / "checkpoints" / "best.pt").exists()
    assert "2 process(es)" in (run / "train.log").read_text()
