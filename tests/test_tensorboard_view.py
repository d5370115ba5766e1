"""What a user sees first in TensorBoard: a run's loss and accuracy curves, the per-layer diagnostics after them.

Rendered by TensorBoard in headless Chromium (the Time Series tab); skipped where Chromium is not installed.
"""

import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import torch.nn as nn

from addernet import Adder2d
from addernet.engine.outputs import RunOutputs

from helpers import free_port

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def write_run(run_dir, epochs=3):
    """Three epochs of a run's records through RunOutputs, as the training loop writes them."""
    model = nn.Sequential(Adder2d(3, 4, 3), nn.BatchNorm2d(4), Adder2d(4, 4, 3))
    outputs = RunOutputs(str(run_dir), main=True)
    for epoch in range(1, epochs + 1):
        record = {
            "epoch": epoch,
            "train_loss": 2.0 / epoch,
            "train_top1": 30.0 * epoch,
            "val_loss": 2.2 / epoch,
            "val_top1": 25.0 * epoch,
            "val_top5": 60.0 + epoch,
            "lr": 0.1 / epoch,
            "images_per_s": 100.0,
        }
        outputs.write_epoch(record, {"0": 0.5 * epoch, "2": 0.2 * epoch}, model, histograms=True)
    outputs.close({"model": "demo"}, {"val_summary/best_top1": 75.0})


def serve(logdir):
    """A TensorBoard process on a free loopback port, once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/data/runs", timeout=5).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("TensorBoard did not answer within 2 minutes")


def chromium(*args):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000"]
    return subprocess.run(
        [*cmd, "--virtual-time-budget=20000", *args], capture_output=True, text=True, timeout=300
    ).stdout


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium) to render TensorBoard"
)
def test_time_series_opens_on_loss_and_accuracy(tmp_path):
    write_run(tmp_path / "outputs" / "demo")
    proc, url = serve(tmp_path / "outputs")
    try:
        dom = chromium("--dump-dom", f"{url}/#timeseries")
        shot = tmp_path / "timeseries.png"
        chromium(f"--screenshot={shot}", f"{url}/#timeseries")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    runs = re.findall(r'data-id="[^"]*?/(demo/tensorboard[^"]*)"', dom)
    assert {"demo/tensorboard", "demo/tensorboard/diagnostics"} <= set(runs), runs  # labelled by the run dir
    groups = re.findall(r'class="group-title" title="([^"]+)"', dom)
    assert groups == ["train", "val", "val_summary", "watch", "weights"], groups  # loss and accuracy first
    cards = re.findall(r'class="tag"[^>]*title="([^"]+)"', dom)
    assert cards[:5] == ["train/loss", "train/top1", "val/loss", "val/top1", "val/top5"], cards
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
