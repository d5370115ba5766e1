"""An installed copy (pip install, no checkout on sys.path) trains and evaluates from any directory:
the configs ship inside the package (setup.py copies configs/ to addernet/configs/)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import FAKE, REPO, SHARED, needs_shared

pytestmark = pytest.mark.integration  # pip installs a copy of this repository


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """This repository installed with pip into a folder of its own (``--target``): that folder."""
    target = tmp_path_factory.mktemp("installed") / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, REPO],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return target


@pytest.mark.slow
def test_an_installed_copy_runs_the_quick_start_from_another_directory(tmp_path, installed):
    target, cwd = installed, tmp_path / "elsewhere"
    cwd.mkdir()
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


@pytest.mark.slow
@needs_shared("mnist/MNIST/raw")
def test_an_installed_copy_adds_to_its_zoo_with_a_data_root_relative_to_the_current_folder(tmp_path, installed):
    """zoo_add evaluates with the installed package's test (there is no test.py beside it); --data-root is the
    user's current folder's."""
    from addernet.checkpoint import load_checkpoint, save_checkpoint

    zoo, cwd = installed / "addernet" / "zoo", tmp_path / "elsewhere"
    cwd.mkdir()
    (cwd / "mnist").symlink_to(SHARED / "mnist")
    save_checkpoint(load_checkpoint(zoo / "mnist_lenet5_bn_adder.pt"), cwd / "run" / "checkpoints" / "last.pt")
    env = {**os.environ, "PYTHONPATH": str(installed), "OMP_NUM_THREADS": "1"}
    args = [
        "run",
        "copy",
        "--preset",
        "mnist_lenet5_bn_adder",
        "--command",
        "python train.py ...",
        "--data-root",
        "mnist",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "addernet.tools.zoo_add", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    entry = json.loads(r.stdout.strip().splitlines()[-1])["copy"]
    shipped = json.loads((zoo / "manifest.json").read_text())
    assert entry["top1"] == shipped["mnist_lenet5_bn_adder"]["top1"] and shipped["copy"] == entry
    assert (zoo / "copy.pt").is_file()
