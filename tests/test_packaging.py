"""The package installs with pip (pyproject.toml) and works from any directory, its C kernel sources included."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO


@pytest.mark.integration
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


def readme_install_lines():
    """The commands of the README's Install section in order, then those of docs/install.md's extras block, without
    the venv line and comments."""
    section = (REPO / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    extras = (REPO / "docs" / "install.md").read_text().split("\n## Optional extras\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for text in (section, extras) for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    lines = [x.split("#")[0].strip() for b in blocks for x in b.splitlines()]
    return [x for x in lines if x and not x.startswith("python3 -m venv")]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a git checkout")
def test_the_readme_install_lines_keep_a_clone_named_addernet_from_shadowing_the_package(tmp_path):
    """Cloned into a folder named addernet and used from its parent, the folder would be imported as an empty
    namespace package ahead of an import-hook editable install. The README's install lines and docs/install.md's
    extras lines, run in order in a fresh venv, must each leave the package importable from there."""
    clone, venv = tmp_path / "addernet", tmp_path / "venv"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    # this environment's packages (torch, the extras), reused as a plain path so that pip finds every requirement
    # already there and installs nothing but this repository (their .pth hooks are not run)
    Path(site, "reused.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1")
    check = "import addernet; print(addernet.__file__, hasattr(addernet, 'adderize'))"
    lines = readme_install_lines()
    installs = lines.index("pip install -r requirements.txt")  # the first line that installs this repository
    assert {"pip install -e '.[plot]'", "pip install -r requirements-extras.txt"} <= set(lines[installs + 1 :])
    for i, line in enumerate(lines):
        r = subprocess.run(["bash", "-c", line], cwd=clone, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, (line, r.stderr[-3000:])
        if i >= installs:
            r = subprocess.run(
                [venv / "bin" / "python", "-c", check], cwd=tmp_path, capture_output=True, text=True, env=env
            )
            assert r.stdout.split() == [str(clone / "addernet" / "__init__.py"), "True"], (line, r.stdout, r.stderr)
    [snippet] = [
        b for b in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S) if "adderize" in b
    ]
    r = subprocess.run([venv / "bin" / "python", "-c", snippet], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "replaced layer4.1.conv2: Conv2d -> Adder2d" in r.stdout


def test_readme_install_block_installs_the_cpu_build_first_and_requirements_keep_it():
    """The CPU-only line comes before anything that installs torch, and requirements.txt's pins accept its
    local-version wheels (2.14.1+cpu satisfies ==2.14.1), so pip does not replace them with the CUDA build."""
    from packaging.requirements import Requirement

    block = re.search(r"## Install\n\n```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    lines = [x.split("#")[0].strip() for x in block.splitlines() if x.split("#")[0].strip()]
    [cpu] = [i for i, x in enumerate(lines) if "download.pytorch.org/whl/cpu" in x]
    assert cpu < min(i for i, x in enumerate(lines) if "requirements.txt" in x)
    wheels = dict(w.split("==") for w in lines[cpu].split() if "==" in w)
    text = [x.split("#")[0].strip() for x in (REPO / "requirements.txt").read_text().splitlines()]
    pins = [Requirement(x) for x in text if x and not x.startswith("-")]
    pins = {r.name: r.specifier for r in pins if r.name in wheels}
    assert set(pins) == set(wheels) == {"torch", "torchvision"}
    for name, version in wheels.items():
        assert pins[name].contains(f"{version}+cpu"), name
