"""The reproduction kit: scripts/reproduce.sh trains any paper-table preset, then tests its best checkpoint;
scripts/reproduce.sh cifar10 evaluates the official ResNet-20 in float, quantised and ONNX with intervals."""

import csv
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from addernet.analysis.interval import wilson_interval
from addernet.checkpoint import save_checkpoint
from addernet.data import build_dataset
from addernet.models import build_model
from addernet.tools.reproduce import main as reproduce_main

from helpers import CIFAR10_CLASSES, REPO, compose, write_jpeg_folder

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


@pytest.mark.slow
def test_the_cifar10_reproduction_writes_the_table_csv_and_intervals_on_a_tiny_subset(tmp_path, capsys):
    """scripts/reproduce.sh cifar10 (addernet.tools.reproduce) on a 30 + 20 image folder and a random ResNet-20:
    one CSV row per setting, the float row equal to the model's own predictions, Wilson intervals of the counts."""
    root = tmp_path / "cifar"
    write_jpeg_folder(root / "train", 3, CIFAR10_CLASSES)
    write_jpeg_folder(root / "test", 2, CIFAR10_CLASSES, seed=1)
    torch.manual_seed(0)
    model = build_model("resnet20")
    with torch.no_grad():  # BatchNorm statistics of its own activations, so every adder layer sees inputs
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = None
        model.train()(torch.randn(16, 3, 32, 32))
    checkpoint = tmp_path / "resnet20.pt"
    cfg = compose(["model=resnet20", "data=cifar10_folder", f"data.root={root}"])
    config = OmegaConf.to_container(cfg, resolve=True)
    save_checkpoint({"format_version": 1, "model": model.state_dict(), "config": config, "epoch": 1}, checkpoint)
    onnx = importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime")
    out = tmp_path / "out"
    args = ["cifar10", "--checkpoint", str(checkpoint), "--data-root", str(root), "--bits", "8,4", "--out", str(out)]
    args += [*([] if onnx else ["--no-onnx"]), "quant.calib_images=16", "quant.calib_batch_size=8"]
    reproduce_main([*args, "data.num_workers=0", "data.pin_memory=false", "trainer.progress=false"])
    printed = capsys.readouterr().out

    rows = list(csv.DictReader((out / "results.csv").open()))
    want = ["float", "8 bits", "4 bits", *(["ONNX (float, onnxruntime)"] if onnx else [])]
    assert [r["setting"] for r in rows] == want
    sha = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert {r["checkpoint_sha256"] for r in rows} == {sha} and {r["n"] for r in rows} == {"20"}
    dataset = build_dataset(cfg.data, "val")  # independently: the float model's predictions on the 20 images
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    labels = torch.tensor([dataset[i][1] for i in range(len(dataset))])
    with torch.no_grad():
        correct = int((model.eval()(images).argmax(1) == labels).sum())
    assert int(rows[0]["top1_correct"]) == correct
    for r in rows:
        k = int(r["top1_correct"])
        assert float(r["top1"]) == pytest.approx(100 * k / 20)
        low, high = wilson_interval(k, 20)
        assert (float(r["top1_ci95_low"]), float(r["top1_ci95_high"])) == pytest.approx((100 * low, 100 * high))
    assert [r["bits"] for r in rows[:3]] == ["", "8", "4"]
    assert [round(float(r["adderquant_drop"]), 2) for r in rows[1:3]] == [-0.48, -1.57]
    if onnx:  # the exported float model: the same predictions up to float rounding of near ties
        assert abs(int(rows[-1]["top1_correct"]) - correct) <= 1
    table = (out / "results.md").read_text()
    assert "| float | 20 |" in table and "| 8 bits | 20 |" in table and table.strip() in printed
