"""Inference speed of the integer adder kernel against the float fast kernel and nn.Conv2d (CPU).

Layer mode (default). For every distinct adder-layer shape of ResNet-20, at batch 1 and 64, times
(forward only, no grad):
  conv      nn.Conv2d of the same shape (float32)
  adder     Adder2d with the fast float kernel (float32)
  int8 sum  the integer kernel alone on uint8 inputs: sum |q_a - u| -> int32 (ops/kernels/adder_int.c)
  qadder    a whole QAdder2d at 8 bits with G groups: quantise the input G times, integer kernel per
            group, rescale and bias (what a quantised model runs)
Methods run interleaved (A B C D, A B C D, ...) so machine load hits them alike; each cell is the
median over rounds, +- half the interquartile range; the load average is printed before and after.

    python scripts/bench_quant.py [--rounds N] [--groups G] [--threads N] [--json PATH]

Whole-model mode (--whole-model). ResNet-20 at batch 1 (latency) and 64 (throughput), each model in
a fresh process per round, models in rotated order per round, at 2 and 1 threads:
  conv         the float CNN twin (nn.Conv2d, oneDNN), NCHW float32
  adder        the float AdderNet (the fast float kernel)
  q8 layers    the 8-bit quantised AdderNet, layer by layer (QAdder2d: quantise, kernel, rescale; BN in float)
  q8 / q4 int  the quantised AdderNet as an integer network (addernet.quant.load_quantized)
  conv int8    PyTorch's post-training int8 quantisation of the CNN twin (torch.ao.quantization FX mode,
               x86 backend, calibrated on 64 random images: speed only)
  conv int8 pt2e  the same twin through PyTorch's recommended x86 int8 path: PT2E quantisation with the
               X86 Inductor quantizer (torchao), compiled by Inductor with freezing; in the default list
               when torchao is installed (pip install torchao), which it is not by requirements-extras.txt
Each cell: the median over rounds of each process's median time per forward, +- half the range over
rounds; "cpu" is the process CPU time per forward at the first thread count (at 1 thread it is less
sensitive to other load than the wall time).
The quantised AdderNets come from --q8/--q4 (quantised checkpoints of scripts/quantize.py), or else
from a randomly initialised ResNet-20 quantised on random images (the speed does not depend on it).

    python scripts/bench_quant.py --whole-model [--q8 PATH] [--q4 PATH] [--rounds N] [--reps N]
        [--thread-list 2,1] [--models conv,q8 int,...] [--isa-list native,avx2] [--json PATH]

--isa-list runs every adder-side model once per kernel instruction set (ADDERNET_CPU_ISA, see
docs/adder_layer.md), labelled "model [isa]", in the same interleaved rounds: on an AVX-512 host,
native,avx2 compares the AVX-512 kernels with the AVX2 ones.

One-process mode (--whole-model --one-process). The listed models in this one process, forward by forward in turn
(the order rotated every round), so that each round's models run in the same minute of a shared machine; with
--against CHECKOUT each adder-side model runs a second time on another checkout's C kernels (built from its sources:
ADDERNET_KERNEL_SOURCES, docs/adder_layer.md; the Python is this tree's, and an integer network is packed again
under those kernels, in the layout they read), listed just before this tree's. Per batch,
each model's median time per forward and its range, and the median and quartiles of the per-round ratio of the first
model's time to its time (> 1: faster than the first model), at the first thread count:

    python scripts/bench_quant.py --whole-model --one-process --models "conv int8 pt2e,q8 int" [--rounds N]
    python scripts/bench_quant.py --whole-model --one-process --models "q8 int" --against /tmp/before
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from addernet.checks import json_with, output_file
from addernet.config.schema import Quant
from addernet.errors import reported
from addernet.models import build_model
from addernet.ops import Adder2d
from addernet.ops.kernels import build, int_cpu
from addernet.quant import IntegerResNet, load_quantized_into, quantize_model
from addernet.quant.convert import quantize_layer
from addernet.tools.bench import kernel_sources, median_iqr, set_env

ROOT = Path(__file__).resolve().parents[1]

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
    fns = {
        "conv": lambda: conv(x),
        "adder": lambda: adder(x),
        "int8 sum": lambda: int_cpu.forward(qa, u, (s, s), (p, p), (1, 1), 1, packed),
        "qadder": lambda: q(x),
    }
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


MODELS = ("conv", "adder", "q8 layers", "q8 int", "q4 int", "conv int8", "conv int8 pt2e")
PT2E = "conv int8 pt2e"
BATCHES = (1, 64)


def _random_quantised(bits):
    torch.manual_seed(0)
    model = build_model("resnet20").eval()
    images = torch.rand(64, 3, 32, 32) * 4 - 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.zeros(64)), batch_size=32)
    cfg = OmegaConf.merge(
        OmegaConf.structured(Quant),  # the quant group's defaults
        {"bits": bits, "calib_images": 64, "calib_batch_size": 32},
    )
    return quantize_model(model, loader, cfg)


def _model(name, a):
    if name in ("conv", "adder"):
        return build_model("resnet20", layer=name).eval()
    if name == "conv int8":
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        torch.backends.quantized.engine = "x86"
        x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        prepared = prepare_fx(build_model("resnet20", layer="conv").eval(), get_default_qconfig_mapping("x86"), (x,))
        with torch.no_grad():
            prepared(x)
        return convert_fx(prepared)
    if name == PT2E:
        return _pt2e_int8()
    model = _quantised(name, a)
    return model if name.endswith("layers") else IntegerResNet(model)


def _quantised(name, a):
    """The quantised ResNet-20 of model `name` ("q8 ..." or "q4 ..."): --q8/--q4's file or a random one."""
    bits = int(name[1])
    path = a.q8 if bits == 8 else a.q4
    return (load_quantized_into(build_model("resnet20").eval(), path)[0] if path else _random_quantised(bits)).eval()


def _has_torchao():
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


def _pt2e_int8():
    """The CNN twin quantised by PT2E with the X86 Inductor quantizer (static, per-channel weights) and compiled
    by Inductor with constant folding (freezing): PyTorch's recommended int8 inference path on x86 CPUs."""
    import torch._inductor.config as inductor_config
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    inductor_config.freezing = True
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=1024)
    # strict export: its per-call source records let the quantizer fuse conv + add + ReLU where the network
    # calls one nn.ReLU twice (non-strict export groups those calls and the quantizer refuses the pattern)
    model = build_model("resnet20", layer="conv").eval()
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch},), strict=True)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        prepared(x)
    return torch.compile(convert_pt2e(prepared))


def worker(a):
    """One model in this process: {"threads,batch": [median wall s, median cpu s]} on stdout."""
    import warnings

    warnings.filterwarnings("ignore")
    model = _model(a.worker, a)
    out = {}
    with torch.no_grad():
        for threads, batch in [(t, b) for t in a.thread_list for b in BATCHES]:
            torch.set_num_threads(threads)
            x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))
            model(x)
            inner = 10 if batch == 1 else 1
            walls, cpus = [], []
            for _ in range(a.reps):
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(inner):
                    model(x)
                walls.append((time.perf_counter() - w0) / inner)
                cpus.append((time.process_time() - c0) / inner)
            out[f"{threads},{batch}"] = [statistics.median(walls), statistics.median(cpus)]
    print(json.dumps(out))


def whole_model(a):
    load0 = os.getloadavg()
    print(
        f"{datetime.date.today()} | torch {torch.__version__} | ResNet-20, CIFAR 32x32 | {a.rounds} rounds, fresh "
        f"process per model and round | {build.machine(a.thread_list_arg)}",
        flush=True,
    )
    isas = a.isa_list.split(",") if a.isa_list else [None]
    models = [(m, isa) for m in MODELS if m in a.models for isa in (isas if m.startswith(("adder", "q")) else [None])]
    label = {(m, isa): m if isa is None else f"{m} [{isa}]" for m, isa in models}
    runs = {label[k]: [] for k in models}
    for r in range(a.rounds):
        for m, isa in models[r % len(models) :] + models[: r % len(models)]:
            cmd = [sys.executable, __file__, "--worker", m, "--reps", str(a.reps), "--thread-list", a.thread_list_arg]
            cmd += [f for flag, v in (("--q8", a.q8), ("--q4", a.q4)) if v for f in (flag, v)]
            env = {**os.environ, "OMP_NUM_THREADS": "2", **({"ADDERNET_CPU_ISA": isa} if isa else {})}
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            m = label[m, isa]
            if res.returncode != 0:
                raise SystemExit(f"bench_quant.py: worker {m} failed: {res.stderr.strip()[-800:]}")
            runs[m].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"  {m}: {json.dumps(runs[m][-1])}", flush=True)  # raw [wall s, cpu s] per "threads,batch"
        print(f"round {r + 1}/{a.rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    load1 = os.getloadavg()

    def cell(m, key, i=0):
        v = [run[key][i] * 1e3 for run in runs[m]]
        return statistics.median(v), (max(v) - min(v)) / 2

    models = list(runs)
    keys = [f"{t},{b}" for t in a.thread_list for b in BATCHES]
    head = [f"batch {b} {'ms' if b == 1 else 'img/s'} ({t} thr)" for t in a.thread_list for b in BATCHES]
    print("\n| model | " + " | ".join(head) + " | batch 1 cpu ms | batch 64 cpu ms/img |")
    print("|---" * (len(head) + 3) + "|")
    rows = []
    for m in models:
        cells = []
        for k in keys:
            med, half = cell(m, k)
            cells.append(
                f"{med:.3f} ± {half:.3f}" if k.endswith(",1") else f"{64e3 / med:.0f} ± {64e3 * half / med**2:.0f}"
            )
        c1, c64 = cell(m, keys[0], 1), cell(m, keys[1], 1)  # CPU time at the first thread count
        rows.append({"model": m, **{k: [run[k] for run in runs[m]] for k in keys}})
        print(f"| {m} | " + " | ".join(cells) + f" | {c1[0]:.3f} | {c64[0] / 64:.3f} |")
    if "conv" in models:
        print("\nratios to the float CNN twin (median times; > 1: faster than conv)")
        for m in models:
            ratios = (
                f"thr {k.split(',')[0]} b{k.split(',')[1]}: {cell('conv', k)[0] / cell(m, k)[0]:.2f}x" for k in keys
            )
            print(f"  {m:10s} " + "  ".join(ratios))
    print(f"load average after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"date": str(datetime.date.today()), "load_before": load0, "load_after": load1, "rows": rows}, indent=1
            )
        )


def one_process(a):
    """--one-process: the models in turn in this process, forward by forward (module docstring)."""
    threads = a.thread_list[0]
    torch.set_num_threads(threads)
    other = kernel_sources(a.against) if a.against else None
    entries = []  # (label, model, C kernel sources: None for this tree's)
    for name in a.models:
        if other and name.endswith(" int"):  # the network packed again under those kernels, in their layout
            quantised = _quantised(name, a)
            set_env("ADDERNET_KERNEL_SOURCES", other)
            entries.append((f"{name} [{a.against}]", IntegerResNet(quantised), other))
            set_env("ADDERNET_KERNEL_SOURCES", None)
            model = IntegerResNet(quantised)
        else:
            model = _model(name, a)
            if other and name.startswith(("adder", "q")):
                entries.append((f"{name} [{a.against}]", model, other))
        entries.append((name, model, None))
    print(
        f"{datetime.date.today()} | torch {torch.__version__} | ResNet-20, CIFAR 32x32 | {a.rounds} rounds, one "
        f"process, forward by forward | {build.machine(threads)}",
        flush=True,
    )
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))
            inner = 10 if batch == 1 else 1
            times = {label: [] for label, _, _ in entries}
            for r in range(a.rounds + 1):  # round 0 warms up (kernel builds, Inductor)
                for label, model, src in entries[r % len(entries) :] + entries[: r % len(entries)]:
                    set_env("ADDERNET_KERNEL_SOURCES", src)
                    t = time.perf_counter()
                    for _ in range(inner):
                        model(x)
                    if r:
                        times[label].append((time.perf_counter() - t) / inner * 1e3)
                set_env("ADDERNET_KERNEL_SOURCES", None)
            first = times[entries[0][0]]
            print(f"\nbatch {batch}, {threads} threads, ms per forward")
            print(f"| model | median | min-max | {entries[0][0]} time / this time: median (quartiles) |")
            print("|---|---|---|---|")
            for label, t in times.items():
                med, q1, q3 = median_iqr([f / v for f, v in zip(first, t)])
                spread = f"{min(t):.3f}-{max(t):.3f}"
                print(f"| {label} | {statistics.median(t):.3f} | {spread} | {med:.2f} ({q1:.2f}-{q3:.2f}) |")
    print(f"load average after {os.getloadavg()[0]:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json")
    p.add_argument("--whole-model", action="store_true", help="ResNet-20 end to end (see the module docstring)")
    p.add_argument("--q8", help="8-bit quantised checkpoint (scripts/quantize.py) for --whole-model")
    p.add_argument("--q4", help="4-bit quantised checkpoint for --whole-model")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per process in --whole-model")
    p.add_argument("--models", help="comma-separated subset for --whole-model (default: all)")
    p.add_argument("--thread-list", dest="thread_list_arg", default="2,1", help="thread counts for --whole-model")
    p.add_argument("--isa-list", help="kernel instruction sets for the adder-side models, e.g. native,avx2")
    p.add_argument("--one-process", action="store_true", help="--whole-model in this one process, forward by forward")
    p.add_argument(
        "--against", metavar="CHECKOUT", help="--one-process: adder-side models on this checkout's C kernels too"
    )
    p.add_argument("--worker", choices=MODELS, help=argparse.SUPPRESS)
    p.add_argument("--overwrite", action="store_true", help="let --json replace a file this script did not write")
    a = p.parse_args()
    if a.json:
        output_file(a.json, "--json", json_with("date", "load_before", "rows"), a.overwrite)
    if a.models is None:
        a.models = [m for m in MODELS if m != PT2E or _has_torchao()]
        if a.whole_model and not a.worker and PT2E not in a.models:
            print(f"{PT2E}: left out, torchao is not installed (pip install torchao)")
    else:
        a.models = a.models.split(",")
        unknown = [m for m in a.models if m not in MODELS]
        if unknown:
            p.error(f"--models: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(MODELS)}")
        if PT2E in a.models and not _has_torchao():
            p.error(f"--models {PT2E!r} needs torchao (pip install torchao)")
    a.thread_list = [int(t) for t in a.thread_list_arg.split(",")]
    if a.one_process and not a.whole_model:
        p.error("--one-process times whole models: add --whole-model")
    if a.one_process and (a.json or a.isa_list):
        p.error("--one-process prints its tables only: drop --json and --isa-list (--against compares kernels)")
    if a.against and not a.one_process:
        p.error("--against runs in one process: add --whole-model --one-process")
    if a.against and not Path(kernel_sources(a.against)).is_dir():
        p.error(f"--against needs a checkout of this repository; got {a.against!r}")
    if a.worker:
        return worker(a)
    if a.one_process:
        return one_process(a)
    if a.whole_model:
        return whole_model(a)
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    print(
        f"{datetime.date.today()} | torch {torch.__version__} | {build.machine(a.threads)} | "
        f"qadder: 8 bits, G={a.groups}"
    )
    print(
        "| shape | batch | conv ms | adder (float) ms | int8 sum ms | qadder ms | adder / int8 sum | adder / qadder |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for batch in (1, 64):
        for shape in SHAPES:
            r = bench(shape, batch, a.rounds, a.groups)
            rows.append({"shape": shape[0], "batch": batch, **{k: v for k, v in r.items()}})
            cell = " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in r.values())
            print(
                f"| {shape[0]} | {batch} | {cell} | {r['adder'][0] / r['int8 sum'][0]:.2f}x | "
                f"{r['adder'][0] / r['qadder'][0]:.2f}x |",
                flush=True,
            )
    load1 = os.getloadavg()
    print(f"load average after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "date": str(datetime.date.today()),
                    "threads": a.threads,
                    "load_before": load0,
                    "load_after": load1,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    with reported("bench_quant.py"):
        main()
