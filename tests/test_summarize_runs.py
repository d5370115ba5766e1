"""scripts/summarize_runs.py (gpu_check.sh stage 4): the throughput table and the projected recipe time."""
import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import REPO

SCRIPT = REPO / "scripts" / "summarize_runs.py"


def _module():
    spec = importlib.util.spec_from_file_location("summarize_runs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, name, records, *, on_device=False, compile=False, layer="adder", log_lines=()):
    d = Path(tmp_path) / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    OmegaConf.save(OmegaConf.create({"model": {"name": "resnet20", "layer": layer},
                                     "data": {"on_device": on_device}, "trainer": {"compile": compile}}),
                   d / "config.yaml")
    (d / "train.log").write_text("\n".join(["[t][addernet.train][INFO] run dir x | 1 process(es) | device cuda:0 | "
                                            "amp off", "[t][addernet.train][INFO] data fake: 50000 train / 10000 val "
                                            "images, global batch 256", *log_lines]) + "\n")
    return d


def _epoch(seconds, ips, vips):
    return {"epoch": 1, "epoch_seconds": seconds, "images_per_s": ips, "val_images_per_s": vips}


def test_projection_is_the_last_epoch_at_cifar_sizes(tmp_path):
    mod = _module()
    # last epoch: 50,000 / 10,000 img/s = 5 s train, 10,000 / 20,000 = 0.5 s val, 0.5 s overhead -> 6 s
    run = _run(tmp_path, "a", [_epoch(60.0, 1_000, 1_000), _epoch(6.0, 10_000, 20_000)], on_device=True,
               log_lines=["[t][addernet.data][INFO] data.on_device: train split held on cuda:0 as uint8 ..."])
    row = mod.summarize(run, epochs=400)
    assert row["overhead_s"] == pytest.approx(0.5)
    assert row["projected_h"] == pytest.approx(400 * 6.0 / 3600)
    assert (row["data"], row["device"], row["epochs_run"], row["notes"]) == ("device", "cuda:0", 2, [])
    assert "| resnet20 adder | device | off | cuda:0 | 10000 | 20000 | 6.00 | 0.67 h |  |" in mod.table([row], 400)


def test_notes_say_what_did_not_take_effect(tmp_path):
    mod = _module()
    run = _run(tmp_path, "b", [_epoch(6.0, 10_000, 20_000)], on_device=True, compile=True,
               log_lines=["[t][addernet.data][INFO] data.on_device: train split held on cpu as uint8 ..."])
    assert mod.summarize(run)["notes"] == ["one epoch only: includes warm-up",
                                           "data held on cpu, not cuda:0 (build_loader got no device)",
                                           "not compiled (engine does not call compile_model)"]


def test_a_run_without_metrics_is_reported_not_measured(tmp_path, capsys):
    mod = _module()
    good = _run(tmp_path, "c", [_epoch(6.0, 10_000, 20_000)])
    (tmp_path / "d").mkdir()
    assert mod.main([str(good), str(tmp_path / "d"), "--json", str(tmp_path / "rows.json")]) == 1
    out = capsys.readouterr().out
    assert "| resnet20 adder | DataLoader |" in out and f"not measured: {tmp_path / 'd'}" in out
    assert [r["run"] for r in json.loads((tmp_path / "rows.json").read_text())] == ["c"]
