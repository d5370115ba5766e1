"""The benchmark scripts' bookkeeping (no timing is asserted): the profile categories find the adder
ops under the names torch's profiler gives them, and the interleaved ratios are computed per round."""

import os

import torch
import torch.nn as nn

from addernet import Adder2d

from helpers import load_script


def test_profile_categories_find_the_adder_kernels(monkeypatch):
    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    prof_step = load_script("profile_step")
    torch.manual_seed(0)
    model = nn.Sequential(Adder2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    model(x).sum().backward()  # warm-up: kernel build
    with torch.profiler.profile() as prof:
        model(x).sum().backward()
    seen = {}
    for ev in prof.events():
        cat = prof_step._category(ev)
        assert cat in prof_step.CATEGORIES, cat
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
    assert "aten::convolution_backward" in seen["adder weight-grad"]  # not counted as a convolution
    assert not any("adder" in n for n in seen.get("other", ())), seen["other"]


def test_interleaved_ratios_are_per_round_medians():
    bench = load_script("bench_adder")
    t = bench._summary("step", [30.0, 20.0, 100.0], [10.0, 20.0, 50.0], "ms", lower_is_better=True)
    assert (t["ratio"], t["ratio_min"], t["ratio_max"]) == (2.0, 1.0, 3.0)
    assert (t["adder"], t["conv"]) == (30.0, 20.0)
    ips = bench._summary("train", [100.0, 50.0], [150.0, 100.0], "images/s", lower_is_better=False)
    assert (ips["ratio_min"], ips["ratio_max"]) == (1.5, 2.0)  # CNN images/s over AdderNet's
    n = os.cpu_count() or 1
    assert bench._busy((0.6 * n, 0, 0), (0.1, 0, 0)) and not bench._busy((0.1, 0, 0), (1.0 * n, 0, 0))
