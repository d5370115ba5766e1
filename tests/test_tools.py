"""The user tools run from the package, ``python -m addernet.<module>``, from any directory, and write nothing
for ``--help``; ``scripts/<name>.py`` are the same commands (tested in each tool's own tests)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, run_main

ZOO = REPO / "addernet" / "zoo" / "mnist_lenet5_bn_adder_conv2.pt"  # conv2 an adder layer: ONNX export takes it

COMMANDS = {
    "addernet.analysis.summarize": "usage: summarize.py",
    "addernet.analysis.curves": "usage: curves.py",
    "addernet.tools.zoo_add": "--replace",
    "addernet.tools.convert_official": "usage: convert_official.py",
    "addernet.tools.quantize": "Configuration groups",
    "addernet.tools.export_onnx": "Configuration groups",
    "addernet.tools.count_ops": "Configuration groups",
}


@pytest.mark.integration
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


def test_export_onnx_refuses_an_opset_it_cannot_write_before_any_work(tmp_path):
    from addernet.tools import export_onnx

    for opset in (16, 21, 99):
        r = run_main(
            export_onnx.cli, "export_onnx.py", [f"checkpoint={ZOO}", f"out={tmp_path / 'm.onnx'}", f"opset={opset}"]
        )
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"export_onnx.py: error: opset={opset} cannot be written: use 17 to 20" in r.stderr
    assert not list(tmp_path.iterdir())


def test_the_opset_range_is_what_torchs_exporter_writes(tmp_path):
    """20 is the highest opset torch.onnx.export (TorchScript) supports: it warns for 21."""
    import warnings

    import torch

    from addernet.quant.onnx import OPSETS

    pytest.importorskip("onnx")
    for opset in (OPSETS[-1], OPSETS[-1] + 1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.onnx.export(
                torch.nn.Linear(2, 2), (torch.zeros(1, 2),), tmp_path / "x.onnx", dynamo=False, opset_version=opset
            )
        unsupported = [w for w in caught if f"opset version {opset} is not supported" in str(w.message)]
        assert bool(unsupported) == (opset not in OPSETS), opset


def test_export_onnx_out_in_a_missing_folder_creates_it(tmp_path):
    from addernet.tools import export_onnx

    pytest.importorskip("onnx")
    out = tmp_path / "new" / "folder" / "lenet.onnx"
    r = run_main(export_onnx.cli, "export_onnx.py", [f"checkpoint={ZOO}", f"out={out}"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["out"] == str(out) and out.stat().st_size > 0
    (tmp_path / "file").write_text("x")
    r = run_main(export_onnx.cli, "export_onnx.py", [f"checkpoint={ZOO}", f"out={tmp_path / 'file' / 'm.onnx'}"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"out={tmp_path / 'file' / 'm.onnx'}: cannot create its folder {tmp_path / 'file'}" in r.stderr


def test_convert_official_never_replaces_its_input_or_a_file_it_did_not_write(tmp_path, official_r20, capsys):
    from addernet.checkpoint import load_checkpoint
    from addernet.tools import convert_official as tool

    src, user = tmp_path / "ResNet20-AdderNet.pth", tmp_path / "mine.pt"
    shutil.copy(official_r20, src)
    user.write_bytes(b"a user's weights")
    for dst, message in ((src, f"OUT {src} is IN itself"), (user, f"OUT {user}: that file exists and was not written")):
        with pytest.raises(SystemExit) as e:
            tool.main([str(src), str(dst)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert src.read_bytes() == official_r20.read_bytes() and user.read_bytes() == b"a user's weights"
    out = tmp_path / "resnet20.pt"
    tool.main([str(src), str(out)])
    tool.main([str(src), str(out)])  # an earlier conversion is replaced
    tool.main([str(src), str(user), "--overwrite"])
    assert load_checkpoint(user)["source"]["sha256"] == load_checkpoint(out)["source"]["sha256"]
