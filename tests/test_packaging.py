"""The package installs with pip (pyproject.toml) and works from any directory, its C kernel sources included."""

import shutil
import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.slow
def test_pip_installed_wheel_imports_and_runs_from_another_directory(tmp_path):
    wheels, site, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    src.mkdir()  # build from a copy: setuptools writes build/ into the source tree
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "addernet", src / "addernet", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [wheel] = wheels.glob("addernet-*.whl")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    code = (
        "import addernet, torch, torch.nn.functional as F\n"
        "from addernet.ops import adder2d as op\n"
        "assert addernet.__file__.startswith(%r), addernet.__file__\n"
        "x, w = torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)\n"
        "y = addernet.adder2d(x, w, padding=1)\n"
        "cols = F.unfold(x, 3, padding=1)  # closed form: -sum |patch - filter|\n"
        "ref = -(cols.unsqueeze(1) - w.view(1, 4, -1, 1)).abs().sum(2).view(2, 4, 8, 8)\n"
        "assert torch.allclose(y, ref), (y - ref).abs().max()\n"
        "import addernet.tasks, addernet.engine, addernet.checkpoint\n"
        "print('ok')\n"
    ) % str(site)
    env = {"PYTHONPATH": str(site), "ADDERNET_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert list((tmp_path / "cache").glob("adder_cpu_*.so"))  # the fast kernel compiled from the installed sources
