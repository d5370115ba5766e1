"""Training-step throughput of the any-network adder models against their twins (docs/any_network.md).

For each pair (the adder ViT and its ordinary twin on 1x28x28 MNIST-sized inputs, "vit", and on 3x32x32,
"vit32": width 64, depth 4, 4 heads, patch 4, 64 tokens; the adderized torchvision ResNet-18 and torchvision's
ResNet-18 on 3x32x32), times one training step (forward, cross-entropy, backward,
the adaptive LR on the adder side, SGD) on random data, the two sides interleaved A B A B over --rounds rounds
of --repeats steps each, after one warm-up step each. Prints per side the median images/s over rounds with
its min-max, the median of the per-round ratios (adder time / twin time) in wall time and in process CPU
time (with one thread the robust figure on a shared machine), and the load average before and after.
With --ops, the same for the ViT's adder ops alone, forward + backward at the vit32 step's shapes, against
the ops of its twin: l1_scores against q @ k^T, AdderLinear against nn.Linear.

    python scripts/bench_anynet.py [--only vit32] [--ops] [--threads 1] [--rounds 5] [--repeats 3] [--batch 64]
                                   [--system-malloc]

It runs with the allocator train.py trains with (trainer.retain_freed_memory: glibc keeps freed memory), or with
--system-malloc the C library's defaults.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from addernet import AdaptiveLR, AdderLinear, l1_scores
from addernet.checks import json_with, output_file
from addernet.errors import reported
from addernet.models import build_model
from addernet.ops.kernels import build
from addernet.tools.bench import timing_allocator

PAIRS = {
    "vit": (dict(name="vit", num_classes=10, in_channels=1, image_size=28), (1, 28, 28)),
    "vit32": (dict(name="vit", num_classes=10, in_channels=3, image_size=32), (3, 32, 32)),
    "torchvision resnet18": (dict(name="torchvision", num_classes=10, in_channels=3, arch="resnet18"), (3, 32, 32)),
}


def _load():
    return os.getloadavg()


def _stepper(spec, layer, shape, batch):
    torch.manual_seed(0)
    model = build_model(layer=layer, **spec).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if layer == "adder":
        AdaptiveLR(model, 0.2).attach(opt)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _op_steppers(batch):
    """fwd + bwd of the vit32 step's adder ops and their twins' (batch x 64 tokens, width 64, 4 heads of 16)."""
    torch.manual_seed(0)
    q, k = (torch.randn(batch, 4, 64, 16, requires_grad=True) for _ in range(2))
    x = torch.randn(batch, 64, 64, requires_grad=True)
    layers = {
        (kind, out): (AdderLinear if kind == "adder" else nn.Linear)(64, out)
        for kind in ("adder", "conv")
        for out in (64, 128)
    }

    def run(f):
        def step():
            f().sum().backward()

        return step

    return {
        "l1_scores / q @ k^T": {
            "adder": run(lambda: l1_scores(q, k)),
            "conv": run(lambda: q @ k.transpose(-1, -2)),
        },
        **{
            f"AdderLinear / nn.Linear 64->{out}": {
                "adder": run(lambda out=out: layers["adder", out](x)),
                "conv": run(lambda out=out: layers["conv", out](x)),
            }
            for out in (64, 128)
        },
    }


def bench_pair(spec, shape, batch, rounds, repeats, steps=None):
    steps = steps or {layer: _stepper(spec, layer, shape, batch) for layer in ("adder", "conv")}
    for step in steps.values():
        step()
    wall = {k: [] for k in steps}
    cpu = {k: [] for k in steps}
    for _ in range(rounds):
        for layer, step in steps.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(repeats):
                step()
            wall[layer].append((time.perf_counter() - w0) / repeats)
            cpu[layer].append((time.process_time() - c0) / repeats)
    ips = {k: [batch / t for t in v] for k, v in wall.items()}
    return {
        "ms": {k: {"wall": 1e3 * statistics.median(wall[k]), "cpu": 1e3 * statistics.median(cpu[k])} for k in wall},
        **{f"{k}_images_per_s": {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ips.items()},
        "ratio_wall": statistics.median(a / c for a, c in zip(wall["adder"], wall["conv"])),
        "ratio_cpu": statistics.median(a / c for a, c in zip(cpu["adder"], cpu["conv"])),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--only", choices=list(PAIRS), default=None)
    p.add_argument("--ops", action="store_true", help="time the ViT's adder ops against their twins' instead")
    p.add_argument("--system-malloc", action="store_true", help="the C library's allocator defaults, not train.py's")
    p.add_argument("--json", default=None)
    p.add_argument("--overwrite", action="store_true", help="let --json replace a file this script did not write")
    args = p.parse_args()
    if args.json:
        output_file(args.json, "--json", json_with("machine", "rounds", "load_before"), args.overwrite)
    torch.set_num_threads(args.threads)
    out = {
        "threads": args.threads,
        "batch": args.batch,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "load_before": _load(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": build.machine(args.threads),
        "allocator": timing_allocator(args.system_malloc),
    }
    print(f"{out['date']} | {out['machine']} | allocator: {out['allocator']}", flush=True)
    todo = {n: (spec, shape, None) for n, (spec, shape) in PAIRS.items() if not args.only or n == args.only}
    if args.ops:
        todo = {n: (None, None, s) for n, s in _op_steppers(args.batch).items()}
    for name, (spec, shape, steps) in todo.items():
        r = bench_pair(spec, shape, args.batch, args.rounds, args.repeats, steps)
        out[name] = r
        a, c = r["adder_images_per_s"], r["conv_images_per_s"]
        print(
            f"{name}: adder {a['median']:.1f} img/s ({a['min']:.1f}-{a['max']:.1f}), twin {c['median']:.1f} img/s "
            f"({c['min']:.1f}-{c['max']:.1f}); adder/twin step time {r['ratio_wall']:.2f}x wall, "
            f"{r['ratio_cpu']:.2f}x CPU; ms adder {r['ms']['adder']['wall']:.2f} wall {r['ms']['adder']['cpu']:.2f} "
            f"CPU, twin {r['ms']['conv']['wall']:.2f} wall {r['ms']['conv']['cpu']:.2f} CPU",
            flush=True,
        )
    out["load_after"] = _load()
    print(f"load average before {out['load_before'][0]:.2f}, after {out['load_after'][0]:.2f}")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    with reported("bench_anynet.py"):
        main()
