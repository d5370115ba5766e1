"""The reproduction kit: scripts/reproduce.sh trains any paper-table preset, then tests its best checkpoint."""

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

ALL_PRESETS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
EXPERIMENTS = [p for p in ALL_PRESETS if p not in ("quickstart", "debug")]  # the paper-table rows
SCRIPT = REPO / "scripts" / "reproduce.sh"


@pytest.mark.slow
def test_one_script_lists_every_preset_with_its_paper_number():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    r = subprocess.run([str(SCRIPT), "--list"], capture_output=True, text=True)
    assert r.returncode == 0
    listed = dict(line.split(None, 1) for line in r.stdout.strip().splitlines())
    assert sorted(listed) == ALL_PRESETS
    assert re.search(r"reports 91\.84%", listed["cifar10_resnet20_adder"])
    assert all(re.search(r"reports [0-9.]+%", listed[name]) for name in EXPERIMENTS)
    assert re.search(r"PKKD .*reports 92\.96%", listed["cifar10_resnet20_pkkd"])


@pytest.mark.slow
def test_unknown_preset_is_a_clear_error():
    r = subprocess.run([str(SCRIPT), "cifar10_resnet99_adder"], capture_output=True, text=True)
    assert r.returncode == 2 and "no preset configs/experiment/cifar10_resnet99_adder.yaml" in r.stderr


@pytest.mark.slow
def test_a_reproduction_script_runs_end_to_end(tmp_path):
    """Train 1 epoch on FakeData through the script; test.py on best.pt gives the run's own validation numbers."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "RUN_DIR": str(run_dir), "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [
            str(SCRIPT),
            "cifar10_resnet20_cnn",
            "data=fake",
            "data.train_size=32",
            "data.val_size=13",
            "data.batch_size=8",
            "trainer.epochs=1",
            "trainer.progress=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    epoch = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    result = json.loads((run_dir / "test_results.json").read_text())
    assert json.loads(r.stdout.strip().splitlines()[-1]) == result
    # determinism on one machine: test.py scores the weights the run validated last
    assert result["n"] == epoch["val_n"] == 13
    assert result["top1"] == pytest.approx(epoch["val_top1"], abs=1e-9)
    assert result["top5"] == pytest.approx(epoch["val_top5"], abs=1e-9)
    assert result["loss"] == pytest.approx(epoch["val_loss"], rel=1e-6)


@pytest.mark.slow
def test_eval_pretrained_usage_error():
    r = subprocess.run([str(REPO / "scripts" / "eval_pretrained.sh"), "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage:" in r.stderr
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "eval_pretrained.sh")]).returncode == 0
