"""Where the time of one training step goes, the adder model vs its twin (torch.profiler): ResNet-20 on 3x32x32,
or the ViT (model=vit: width 64, depth 4, 4 heads, patch 4) on 3x32x32 with --model vit.

Runs warm-up steps, times --steps unprofiled steps (zero_grad, forward, cross-entropy, backward,
adaptive LR, SGD; process CPU time and wall time), then profiles --steps more, for each twin in its
own subprocess (so one's allocations cannot slow the other). Prints each category's share of the
profiled self time, and that share of the step's process CPU time: the adder layers' forward /
input gradient / weight gradient (the C kernel apart from the weight packing, casts and copies
around it; where the input-gradient kernel also sums the weight gradient's product term, that is in
the input-gradient row, and the weight-gradient row holds the rest; in the ViT these are AdderLinear's,
and l1_scores has its own rows), convolution,
BatchNorm, ReLU, residual adds and gradient accumulation, matmuls, LayerNorm, softmax, the
adaptive-LR hook, the optimizer, everything else (addernet/analysis/profile.py). Profiler times
are wall time inside each op, so other load inflates them; the shares and the 1-thread CPU time are
the figures that survive a busy machine.

    python scripts/profile_step.py [--model resnet20|vit] [--batch 64] [--steps 5] [--threads 1] [--json PATH]
                                   [--system-malloc]

Each process runs with the allocator train.py trains with (trainer.retain_freed_memory: glibc keeps freed memory),
or with --system-malloc the C library's defaults.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from addernet.analysis.profile import CATEGORIES, L1_SCORES, category
from addernet.checks import json_with, output_file
from addernet.errors import reported
from addernet.tools.bench import describe, load, metadata, run_child, timing_allocator

MODELS = {"resnet20": {}, "vit": {"image_size": 32, "width": 64, "depth": 4, "heads": 4, "patch_size": 4}}


def _label_l1_scores():
    """Run the ViT's l1_scores under a profiler label, so that its forward is told apart from AdderLinear's."""
    from torch.profiler import record_function

    from addernet.models import attention

    scores = attention.l1_scores

    def labelled(*a, **k):
        with record_function(L1_SCORES):
            return scores(*a, **k)

    attention.l1_scores = labelled


def profile(model_name, layer, batch, steps, threads, system_malloc):
    import torch
    import torch.nn as nn
    from torch.profiler import ProfilerActivity, record_function

    from addernet import AdaptiveLR
    from addernet.models import build_model

    timing_allocator(system_malloc)
    torch.set_num_threads(threads)
    os.environ["ADDERNET_BACKEND"] = "fast"
    torch.manual_seed(0)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    model = build_model(model_name, layer, **MODELS[model_name]).train()
    if model_name == "vit":
        _label_l1_scores()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    if layer == "adder":
        alr = AdaptiveLR(model, 0.2)
        scale = alr._scale

        def labelled(*a, **k):
            with record_function("adaptive_lr"):
                return scale(*a, **k)

        alr._scale = labelled
        alr.attach(opt)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):  # unprofiled: the step's process CPU time, robust to other load
        step()
    cpu = (time.process_time() - c) * 1e3 / steps
    wall = (time.perf_counter() - t) * 1e3 / steps
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ms = defaultdict(float)
    for ev in prof.events():
        ms[category(ev)] += ev.self_cpu_time_total / 1e3 / steps
    return {"wall_ms": wall, "cpu_ms": cpu, "self_cpu_ms": dict(ms)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="resnet20")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: robust on a busy machine)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--system-malloc", action="store_true", help="the C library's allocator defaults, not train.py's")
    ap.add_argument("--child", choices=("adder", "conv"), help=argparse.SUPPRESS)
    ap.add_argument("--overwrite", action="store_true", help="let --json replace a file this script did not write")
    args = ap.parse_args()
    if args.json:
        output_file(args.json, "--json", json_with("load_before", "load_after"), args.overwrite)
    if args.child:
        print(json.dumps(profile(args.model, args.child, args.batch, args.steps, args.threads, args.system_malloc)))
        return
    print(f"# {describe(metadata(args.threads))}")
    print(f"# allocator: {timing_allocator(args.system_malloc)}")  # this process's, as its children set it
    load_before = load()
    res = {}
    for layer in ("adder", "conv"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            layer,
            "--model",
            args.model,
            "--batch",
            str(args.batch),
            "--steps",
            str(args.steps),
            "--threads",
            str(args.threads),
        ] + ["--system-malloc"] * args.system_malloc
        res[layer] = run_child(cmd, f"profiling the {layer} twin")
    load_after = load()
    print(
        f"# {args.model} step, batch {args.batch}, {args.threads} thread(s), {args.steps} profiled steps; "
        f"loadavg {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    # profiler times are wall time inside each op, inflated alike by other load; shown as shares of
    # the profiled total and as those shares of the unprofiled step's process CPU time
    tot = {k: sum(v["self_cpu_ms"].values()) for k, v in res.items()}
    print("| category | adder % | adder ms | twin % | twin ms |\n|---|---|---|---|---|")
    for c in CATEGORIES:
        a, b = (
            res["adder"]["self_cpu_ms"].get(c, 0.0) / tot["adder"],
            res["conv"]["self_cpu_ms"].get(c, 0.0) / tot["conv"],
        )
        if a or b:
            print(
                f"| {c} | {100 * a:.1f} | {a * res['adder']['cpu_ms']:.1f} | {100 * b:.1f} | "
                f"{b * res['conv']['cpu_ms']:.1f} |"
            )
    print(f"| step, process CPU ms | 100 | {res['adder']['cpu_ms']:.1f} | 100 | {res['conv']['cpu_ms']:.1f} |")
    print(f"| step, wall ms (unprofiled) | | {res['adder']['wall_ms']:.1f} | | {res['conv']['wall_ms']:.1f} |")
    print(
        f"# adder/twin step ratio: {res['adder']['cpu_ms'] / res['conv']['cpu_ms']:.2f} (process CPU time), "
        f"{res['adder']['wall_ms'] / res['conv']['wall_ms']:.2f} (wall)"
    )
    if args.json:
        args.json.write_text(json.dumps({"load_before": load_before, "load_after": load_after, **res}, indent=1))


if __name__ == "__main__":
    with reported("profile_step.py"):
        main()
