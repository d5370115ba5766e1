"""The README's quick start, run exactly as written, from a fresh working directory (no data, no network)."""

import json
import re
import subprocess
import sys

import pytest

from helpers import REPO

TRAIN = "python train.py experiment=quickstart hydra.run.dir=outputs/quickstart"
TEST = "python test.py checkpoint=outputs/quickstart/checkpoints/best.pt"


def test_readme_shows_these_commands():
    text = (REPO / "README.md").read_text()
    assert TRAIN in text and TEST in text
    command = re.search(r"^python -m pytest -q .*tests( .*)?$", text, re.M)  # the README's test command
    assert command and command.group(0) in (REPO / ".ci" / "run").read_text().splitlines()  # what CI runs


@pytest.mark.slow
def test_quickstart_trains_then_test_py_evaluates_its_checkpoint(tmp_path):
    def run(command):
        args = command.split()[1:]
        args[0] = str(REPO / args[0])  # the repo's train.py / test.py, launched from a fresh directory
        return subprocess.run(
            [sys.executable, *args, "trainer.progress=false"], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )

    r = run(TRAIN)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "quickstart"
    assert {"checkpoints", "metrics.jsonl", "tensorboard", "train.log", "config.yaml"} <= {
        p.name for p in run_dir.iterdir()
    }
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    best = max(
        (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()),
        key=lambda rec: rec["val_top1"],
    )
    r = run(TEST)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["n"] == best["val_n"] == 128
    assert result["top1"] == pytest.approx(best["val_top1"], abs=1e-9)  # determinism: the run's own best, rescored
