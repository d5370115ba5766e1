"""torchrun with 2 CPU processes (gloo) through scripts/dist_train.sh: one run dir, rank 0 alone writes,
validation counts every sample exactly once and matches a single-process evaluation."""

import json
import os
import sys

import pytest

from addernet.checkpoint import load_checkpoint
from addernet.data import build_loader
from addernet.engine import evaluate, model_from_config

from helpers import FAKE, RUN_FILES, compose, run_train

ARGS = [*FAKE, "data.train_size=64", "data.val_size=37", "trainer.epochs=2"]  # 4 steps of 16 an epoch


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_cpu_processes(tmp_path):
    run = tmp_path / "outputs" / "job"
    proc = run_train(
        ARGS,
        script=("bash", "scripts/dist_train.sh", "2"),
        timeout=300,
        env={"PYTHON": sys.executable, "RUN_DIR": str(run), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert os.listdir(tmp_path / "outputs") == ["job"]  # one run dir for the job
    assert {p.name for p in run.iterdir()} == RUN_FILES | {".hydra"}
    tb = run / "tensorboard"
    # rank 0's writer and, in the same dir (one run in TensorBoard), its hparams writer
    assert len([p for p in tb.iterdir() if p.name.startswith("events")]) == 2
    assert [p.name for p in tb.iterdir() if p.is_dir()] == ["diagnostics"]  # the per-layer run
    log = (run / "train.log").read_text()
    assert "| 2 process(es) |" in log and log.count("epoch 2/2 lr") == 1 and log.count("epoch 1/2 step 4/4") == 1

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and all(r["val_n"] == 37 for r in records)

    # The reduced validation numbers equal one process evaluating the saved weights on all 37 images.
    cfg = compose(ARGS)
    model = model_from_config(cfg)
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2
    model.load_state_dict(ckpt["model"])
    single = evaluate(model, build_loader(cfg.data, "val"), "cpu")
    # the same weights on this machine, split over two processes: counts exact, the float32 loss at 1e-5
    assert single["n"] == 37 and single["top1"] == records[-1]["val_top1"]
    assert single["top5"] == records[-1]["val_top5"]
    assert single["loss"] == pytest.approx(records[-1]["val_loss"], rel=1e-5)
