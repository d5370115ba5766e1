"""The user tools run from the package, ``python -m addernet.<module>``, from any directory, and write nothing
for ``--help``; ``scripts/<name>.py`` are the same commands (tested in each tool's own tests)."""

import os
import subprocess
import sys

import pytest

from helpers import REPO

COMMANDS = {
    "addernet.analysis.summarize": "usage: summarize.py",
    "addernet.analysis.curves": "usage: curves.py",
    "addernet.tools.zoo_add": "--replace",
    "addernet.tools.convert_official": "usage: convert_official.py",
    "addernet.tools.quantize": "Configuration groups",
    "addernet.tools.export_onnx": "Configuration groups",
    "addernet.tools.count_ops": "Configuration groups",
}


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_each_tool_runs_as_a_module_from_another_directory(module, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert COMMANDS[module] in r.stdout
    assert not list(tmp_path.iterdir())  # --help writes no run directory
