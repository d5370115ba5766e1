"""The benchmark scripts' bookkeeping (no timing is asserted): the profile categories find the adder
ops under the names torch's profiler gives them, the interleaved ratios are computed per round, the
reference kernel's memory estimate is its measured peak, and a kernel comparison against another checkout
runs both versions."""

import json
import os
import platform
import re
import runpy
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from addernet import Adder2d, AdderAttention
from addernet.analysis.profile import CATEGORIES, L1_SCORES, category
from addernet.tools.bench import busy, cpu_model, describe, median_iqr, metadata, ratio_summary, ref_estimate_gb

from helpers import REPO, child_env


@pytest.mark.parametrize("fused_bytes", [1 << 20, 0], ids=["weight-gradient-in-the-input-gradient", "separate"])
def test_profile_categories_find_the_adder_kernels(monkeypatch, fused_bytes):
    """The input-gradient kernel sums the weight gradient's product term as it goes, or (a weight over
    FUSED_WEIGHT_BYTES) leaves it to the convolution weight gradient, counted as the adder's weight gradient."""
    from addernet.ops.kernels import cpu

    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    monkeypatch.setattr(cpu, "FUSED_WEIGHT_BYTES", fused_bytes)
    torch.manual_seed(0)
    model = nn.Sequential(Adder2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    model(x).sum().backward()  # warm-up: kernel build
    with torch.profiler.profile() as prof:
        model(x).sum().backward()
    seen = {}
    for ev in prof.events():
        cat = category(ev)
        assert cat in CATEGORIES, cat
        seen.setdefault(cat, set()).add(ev.name)
    for cat in (
        "adder forward: kernel",
        "adder input-grad: kernel",
        "adder weight-grad",
        "BatchNorm forward",
        "BatchNorm backward",
        "ReLU forward",
        "ReLU backward",
    ):
        assert cat in seen, (cat, seen)
    assert "addernet::adder2d_grad_input_weight" in seen["adder input-grad: kernel"]
    assert ("aten::convolution_backward" in seen["adder weight-grad"]) == (not fused_bytes)  # not a convolution's
    assert "aten::sum" in seen["adder weight-grad"]  # W * sum g
    assert not any("adder" in n for n in seen.get("other", ())), seen["other"]


def test_profile_categories_tell_l1_scores_from_adder_linear(monkeypatch):
    """In adder attention the kernels run for AdderLinear and for l1_scores (labelled as profile_step.py does);
    each lands in its own rows, and the attention's own ops in theirs."""
    from addernet.models import attention

    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    scores = attention.l1_scores

    def labelled(*a, **k):
        with torch.profiler.record_function(L1_SCORES):
            return scores(*a, **k)

    monkeypatch.setattr(attention, "l1_scores", labelled)
    torch.manual_seed(0)
    layer = AdderAttention(8, heads=2)
    x = torch.randn(2, 5, 8, requires_grad=True)
    layer(x).sum().backward()  # warm-up: kernel build
    with torch.profiler.profile() as prof:
        layer(x).sum().backward()
    seen = {}
    for ev in prof.events():
        seen.setdefault(category(ev), set()).add(ev.name)
    assert set(seen) <= set(CATEGORIES), set(seen) - set(CATEGORIES)
    # on CPU l1_scores runs its own ops (a weight per image): its forward as the autograd Function's event
    assert "L1ScoresCPU" in seen["l1_scores forward: kernel"]
    assert "addernet::l1_scores_grad_cpu" in seen["l1_scores backward: kernel"]
    assert "addernet::adder2d_grad_input_weight" in seen["adder input-grad: kernel"]  # AdderLinear's
    assert not {"L1ScoresCPU", "addernet::l1_scores_grad_cpu"} & set().union(
        *(names for cat, names in seen.items() if not cat.startswith("l1_scores"))
    )
    for cat in (
        "adder forward: kernel",
        "adder weight-grad",
        "LayerNorm forward",
        "softmax backward",
        "matmul (linear, attention)",
    ):
        assert cat in seen, (cat, seen)


def test_interleaved_ratios_are_per_round_medians():
    t = ratio_summary("step", [30.0, 20.0, 100.0], [10.0, 20.0, 50.0], "ms", lower_is_better=True)
    assert (t["ratio"], t["ratio_min"], t["ratio_max"]) == (2.0, 1.0, 3.0)
    assert (t["adder"], t["conv"]) == (30.0, 20.0)
    ips = ratio_summary("train", [100.0, 50.0], [150.0, 100.0], "images/s", lower_is_better=False)
    assert (ips["ratio_min"], ips["ratio_max"]) == (1.5, 2.0)  # CNN images/s over AdderNet's
    n = os.cpu_count() or 1
    assert busy((0.6 * n, 0, 0), (0.1, 0, 0)) and not busy((0.1, 0, 0), (1.0 * n, 0, 0))
    assert median_iqr([4.0, 1.0, 3.0, 2.0, 5.0]) == (3.0, 1.5, 4.5) and median_iqr([7.0]) == (7.0, 7.0, 7.0)


def test_cpu_model_names_the_instruction_set():
    name, isa = cpu_model()
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    expected = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other" if info else "unknown"
    assert isa == expected and (name in info if info else name == "unknown")
    meta = metadata(threads=3)
    assert (meta["cpu"], meta["isa"], meta["threads"]) == (name, isa, 3)
    assert f"{name} ({isa}), {os.cpu_count()} CPUs, 3 threads" in describe(meta)


_PEAK_RSS_CHILD = """
import ctypes, gc, json, torch
from addernet.ops.reference import adder2d_reference

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # freed blocks over 64 KiB go back to the OS: RSS tracks live memory
n, cin, cout, size = {shape}
x, w = torch.randn(n, cin, size, size, requires_grad=True), torch.randn(cout, cin, 3, 3, requires_grad=True)
g = torch.randn(n, cout, size, size)
adder2d_reference(x, w, (1, 1), (1, 1)).backward(g)  # warm-up
x.grad = w.grad = None
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
base = status("VmRSS")
adder2d_reference(x, w, (1, 1), (1, 1)).backward(g)
print(json.dumps((status("VmHWM") - base) / 2**30))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS through /proc/self/clear_refs is Linux's")
def test_the_reference_memory_estimate_is_its_measured_peak():
    """Peak resident-set rise of one reference fwd+bwd against the estimate (three live blocks). Measured in a
    new process: in this one, earlier tests leave freed memory on malloc's heap, which serves a block without a
    rise in RSS (the rise read 1 or 2 blocks instead of 3)."""
    shape = n, cin, cout, size = 8, 16, 16, 32
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_CHILD.format(shape=shape)], capture_output=True, text=True, env=child_env()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    peak_gb = json.loads(out.stdout.splitlines()[-1])
    assert peak_gb == pytest.approx(ref_estimate_gb(n, cin, cout, size, 3, 1, 1), rel=0.15)


@pytest.mark.parametrize(
    "script, option",
    [(s, "--json") for s in ("bench_adder", "bench_anynet", "bench_gpu", "bench_quant", "profile_step")]
    + [("bench_distill", "--out")],
)
def test_a_results_file_never_replaces_a_file_the_script_did_not_write(tmp_path, monkeypatch, capsys, script, option):
    """Checked before any work: a user's file at --json (or in --out) is refused with one line."""
    user = tmp_path / ("results.md" if option == "--out" else "mine.json")
    user.write_text('{"a user\'s": "results"}')
    monkeypatch.setattr(sys, "argv", [f"{script}.py", option, str(tmp_path if option == "--out" else user)])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO / "scripts" / f"{script}.py"), run_name="__main__")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{option} {user}: that file exists and was not written by this command" in err and "--overwrite" in err
    assert user.read_text() == '{"a user\'s": "results"}' and os.listdir(tmp_path) == [user.name]


@pytest.mark.parametrize(
    "models, says",
    [
        ("conv,q9 int", "--models: unknown 'q9 int'; choose from conv, adder"),
        ("conv,conv int8 pt2e", "--models 'conv int8 pt2e' needs torchao (pip install torchao)"),
    ],
)
def test_bench_quant_names_a_model_it_cannot_run_before_any_work(monkeypatch, capsys, models, says):
    """An unknown model, or PyTorch's PT2E int8 path without torchao, is one line before anything is timed."""
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if not installed
    monkeypatch.setattr(sys, "argv", ["bench_quant.py", "--whole-model", "--models", models])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO / "scripts" / "bench_quant.py"), run_name="__main__")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and says in err.splitlines()[-1], err


def test_bench_quant_one_process_times_each_model_and_the_other_checkouts_kernels_in_turn(monkeypatch, capsys):
    """--one-process: per batch a row per model, the integer network first on the other checkout's kernels (here this
    checkout, built again from its own sources) and then on this tree's, with the ratio to the first row; --against
    is refused outside --one-process or without a checkout."""
    argv = ["bench_quant.py", "--whole-model", "--one-process", "--models", "q8 int", "--against", str(REPO)]
    monkeypatch.setattr(sys, "argv", [*argv, "--rounds", "2", "--thread-list", "1"])
    runpy.run_path(str(REPO / "scripts" / "bench_quant.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("batch ")] == [
        "batch 1, 1 threads, ms per forward",
        "batch 64, 1 threads, ms per forward",
    ]
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| q8 int")]
    assert [r[0] for r in rows] == [f"| q8 int [{REPO}]", "| q8 int"] * 2
    assert all(float(r[1]) > 0 and float(r[3].split()[0]) > 0 for r in rows)
    assert [r[3] for r in rows[::2]] == ["1.00 (1.00-1.00) |"] * 2  # the first row against itself
    assert "ADDERNET_KERNEL_SOURCES" not in os.environ
    for args, says in (
        (["--whole-model", "--against", str(REPO)], "--against runs in one process: add --whole-model --one-process"),
        (["--whole-model", "--one-process", "--against", str(REPO / "docs")], "--against needs a checkout"),
        (["--one-process"], "--one-process times whole models: add --whole-model"),
        (["--whole-model", "--one-process", "--isa-list", "avx2"], "--one-process prints its tables only"),
    ):
        monkeypatch.setattr(sys, "argv", ["bench_quant.py", *args])
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(REPO / "scripts" / "bench_quant.py"), run_name="__main__")
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and says in err.splitlines()[-1], err


def test_bench_adder_against_another_checkout_times_both_kernels_in_one_process(monkeypatch, capsys):
    """--kernels with --against: each row has this tree's rate, the other checkout's and the per-round ratio (here
    the checkout is this one, built again from its own sources); without --kernels, or without a checkout, one line."""
    argv = ["bench_adder.py", "--kernels", "native", "--quick", "--repeats", "1", "--against", str(REPO)]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(REPO / "scripts" / "bench_adder.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    heads = "native fwd G/s | native other fwd | ratio | native grad_in G/s | native other grad_in | ratio | "
    assert heads + "native grad_in+w G/s | native other grad_in+w | ratio" in lines[2]
    rows = [line.split(" | ") for line in lines if line.startswith("| r20 ")]
    assert len(rows) == 7 and all(float(r[4]) > 0 and float(r[7]) > 0 and float(r[10]) > 0 for r in rows)
    assert "ADDERNET_KERNEL_SOURCES" not in os.environ
    for argv, says in (
        (["--against", str(REPO), "--step-rounds", "0"], "--against compares the kernels (--kernels ISA) or the whole"),
        (["--kernels", "native", "--against", str(REPO / "docs")], "--against needs a checkout of this repository"),
    ):
        monkeypatch.setattr(sys, "argv", ["bench_adder.py", *argv])
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(REPO / "scripts" / "bench_adder.py"), run_name="__main__")
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and says in err[-1]


def test_bench_adder_against_another_checkout_times_the_whole_step_in_one_process(monkeypatch, capsys):
    """--against without --kernels: the AdderNet's training step with each checkout's kernels and the CNN twin's,
    in turn in one process; one line per batch with the three step times and the three ratios."""
    argv = ["bench_adder.py", "--against", str(REPO), "--step-rounds", "2", "--step-batches", "2,3", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(REPO / "scripts" / "bench_adder.py"), run_name="__main__")
    lines = [line for line in capsys.readouterr().out.splitlines() if "whole ResNet-20 training step" in line]
    assert [line.split(",")[1].split()[-1] for line in lines] == ["2", "3"]
    for line in lines:
        ratios = re.findall(r"(this/other|this/twin|other/twin) ([\d.]+) \(([\d.]+)-([\d.]+)\)", line)
        assert [r[0] for r in ratios] == ["this/other", "this/twin", "other/twin"], line
        assert all(0 < float(lo) <= float(mid) <= float(hi) for _, mid, lo, hi in ratios), line
    assert "ADDERNET_KERNEL_SOURCES" not in os.environ


@pytest.mark.parametrize("system_malloc", [False, True])
def test_bench_adder_times_layers_with_train_py_allocator_and_measures_memory_apart(
    monkeypatch, capsys, tmp_path, system_malloc
):
    """The layer table's times come from this process with the allocator train.py trains with (freed memory retained,
    or with --system-malloc the C library's defaults): the mmap threshold that makes RSS track live memory is pinned
    only in the fresh process that measures the memory column."""
    import ctypes

    from addernet.engine import allocator

    calls = []

    class Libc:  # records mallopt in this process; everything else is the real library
        def __init__(self, name, *a, **k):
            self.lib = real(name, *a, **k)

        def __getattr__(self, attr):
            if attr == "mallopt":
                return lambda *args: calls.append(args) or 1
            return getattr(self.lib, attr)

    real = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL", Libc)
    out = tmp_path / "layers.json"
    argv = ["bench_adder.py", "--quick", "--repeats", "1", "--step-rounds", "0", "--train-rounds", "0"]
    argv += ["--ref-limit-gb", "0", "--threads", "1", "--json", str(out)] + ["--system-malloc"] * system_malloc
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(REPO / "scripts" / "bench_adder.py"), run_name="__main__")
    capsys.readouterr()
    result = json.loads(out.read_text())
    retained = [(allocator.M_MMAP_THRESHOLD, 32 << 20), (allocator.M_TRIM_THRESHOLD, 2**31 - 1)]
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert calls == ([] if system_malloc or not glibc else retained)
    assert result["meta"]["memory_measured"]
    rows = result["rows"]
    assert [r["shape"] for r in rows] == ["r20 16->16 32x32", "r20 64->64 8x8", "r20 1x1 16->32 s2"]
    for r in rows:  # the layer's output (batch x out x pixels floats) is a lower bound of either side's peak
        out_mb = r["batch"] * r["out"] * (r["size"] // r["stride"]) ** 2 * 4 / 2**20
        assert r["fast_peak_mb"] >= out_mb and r["conv_peak_mb"] >= out_mb and r["fast_ms"] > 0, r
