"""Inference speed of the integer adder kernel against the float fast kernel and nn.Conv2d (CPU).

For every distinct adder-layer shape of ResNet-20, at batch 1 and 64, times (forward only, no grad):
  conv      nn.Conv2d of the same shape (float32)
  adder     Adder2d with the fast float kernel (float32)
  int8 sum  the integer kernel alone on uint8 inputs: sum |q_a - u| -> int32 (ops/kernels/adder_int.c)
  qadder    a whole QAdder2d at 8 bits with G groups: quantise the input G times, integer kernel per
            group, rescale and bias (what a quantised model runs)
Methods run interleaved (A B C D, A B C D, ...) so machine load hits them alike; each cell is the
median over rounds, +- half the interquartile range; the load average is printed before and after.

    python scripts/bench_quant.py [--rounds N] [--groups G] [--threads N] [--json PATH]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from addernet.ops import Adder2d  # noqa: E402
from addernet.ops.kernels import int_cpu  # noqa: E402
from addernet.quant.convert import quantize_layer  # noqa: E402

SHAPES = [  # (name, in, out, size, kernel, stride, padding)
    ("16->16 32x32", 16, 16, 32, 3, 1, 1),
    ("16->32 32x32 s2", 16, 32, 32, 3, 2, 1),
    ("32->32 16x16", 32, 32, 16, 3, 1, 1),
    ("32->64 16x16 s2", 32, 64, 16, 3, 2, 1),
    ("64->64 8x8", 64, 64, 8, 3, 1, 1),
    ("1x1 16->32 s2", 16, 32, 32, 1, 2, 0),
    ("1x1 32->64 s2", 32, 64, 16, 1, 2, 0),
]


def _time(fn, inner):
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def bench(shape, batch, rounds, groups):
    _, cin, cout, size, k, s, p = shape
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, cin, size, size, generator=g)
    conv = nn.Conv2d(cin, cout, k, s, p, bias=False).eval()
    adder = Adder2d(cin, cout, k, stride=s, padding=p).eval()
    q = quantize_layer(adder, act_range=1.0, bits=8, n_groups=groups, kernel="int").eval()
    qa = (x * 255).round().to(torch.uint8)
    u = (2 * q.qweight.to(torch.int32)).clamp(min=0).to(torch.uint8)
    packed = int_cpu.pack_weight(u, 1)
    fns = {"conv": lambda: conv(x), "adder": lambda: adder(x),
           "int8 sum": lambda: int_cpu.forward(qa, u, (s, s), (p, p), (1, 1), 1, packed),
           "qadder": lambda: q(x)}
    inner = max(1, int(2e7 // (batch * cout * cin * k * k * (size // s) ** 2) + 1))
    times = {n: [] for n in fns}
    with torch.no_grad():
        for f in fns.values():
            f()  # warm-up (kernel build, caches)
        for _ in range(rounds):
            for n, f in fns.items():
                times[n].append(_time(f, inner))
    out = {}
    for n, t in times.items():
        q1, _, q3 = statistics.quantiles(t, n=4) if len(t) > 1 else (t[0], t[0], t[0])
        out[n] = (statistics.median(t) * 1e3, (q3 - q1) / 2 * 1e3)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    print(f"{datetime.date.today()} | torch {torch.__version__} | threads {a.threads} | load average before "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} | qadder: 8 bits, G={a.groups}")
    print("| shape | batch | conv ms | adder (float) ms | int8 sum ms | qadder ms | adder / int8 sum | adder / qadder |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for batch in (1, 64):
        for shape in SHAPES:
            r = bench(shape, batch, a.rounds, a.groups)
            rows.append({"shape": shape[0], "batch": batch, **{k: v for k, v in r.items()}})
            cell = " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in r.values())
            print(f"| {shape[0]} | {batch} | {cell} | {r['adder'][0] / r['int8 sum'][0]:.2f}x | "
                  f"{r['adder'][0] / r['qadder'][0]:.2f}x |", flush=True)
    load1 = os.getloadavg()
    print(f"load average after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"date": str(datetime.date.today()), "threads": a.threads,
                                            "load_before": load0, "load_after": load1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
