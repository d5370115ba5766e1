"""An installed copy (pip install, no checkout on sys.path) trains and evaluates from any directory:
the configs ship inside the package (setup.py copies configs/ to addernet/configs/)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import FAKE, REPO


@pytest.mark.slow
def test_an_installed_copy_runs_the_quick_start_from_another_directory(tmp_path):
    target, cwd = tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, REPO],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert (target / "addernet" / "configs" / "train.yaml").is_file()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}

    def run(*args):
        r = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout

    where = run("-c", "import addernet.config as c; print(c.__file__); print(c.config_dir())").split()
    assert all(p.startswith(str(target)) for p in where)  # not the checkout
    run("-m", "addernet.train", "experiment=quickstart", *FAKE, "trainer.epochs=1", "hydra.run.dir=run")
    out = run("-m", "addernet.test", "checkpoint=run/checkpoints/best.pt", "trainer.progress=false")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 8 and result["weights"] == "model"  # FAKE's 8 validation images
