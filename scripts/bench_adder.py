"""Benchmark Adder2d (fast and reference backends) against nn.Conv2d, forward + backward.

For every distinct adder-layer shape of ResNet-20 (batch 64) and a few ResNet-50 shapes (batch 8)
prints the median fwd+bwd wall time and the peak extra memory of: Adder2d fast, Adder2d reference
(skipped when its estimated peak exceeds --ref-limit-gb), nn.Conv2d of the same shape; and the
ratios fast/conv and reference/fast. Methods are timed in interleaved rounds so machine load hits
them alike; ± is half the interquartile range over the median. "fast/conv CPU time" compares
process CPU time instead of wall time: with --threads 1 it is the robust figure on a loaded
machine (with more threads it also counts OpenMP spin-waiting); the whole-step section prints
both as well.

Peak memory is the rise of the process's peak resident set (VmHWM, reset through
/proc/self/clear_refs) over one fwd+bwd, with glibc's mmap threshold pinned so freed tensors go
back to the OS; it counts everything (PyTorch tensors, kernel scratch, library workspaces). It is measured in a
fresh process of its own: the times are taken with the allocator train.py trains with (trainer.retain_freed_memory:
glibc keeps freed memory for reuse; --system-malloc: the C library's defaults, which fault large freed blocks back
in, differently in each process). Pinned, every large allocation is a fresh mapping whose pages fault in on first
touch, and that slowed nn.Conv2d more than Adder2d (1.6-4.2x against 1.1-1.7x on ResNet-20's layers, AMD EPYC Zen 3),
flattering the fast/conv column.

The whole-step section times one ResNet-20 training step (forward, backward, adaptive LR, SGD)
of the AdderNet and its CNN twin at batch 64 and 128, each measurement in a fresh subprocess (a
big allocation of one side, e.g. the reference kernel's, once slowed the other 3x in-process),
the two sides interleaved A B A B over --step-rounds rounds. The train.py section runs
`python train.py data=fake ... trainer.epochs=1` (FakeData, default loader settings) for both
twins, interleaved over --train-rounds rounds, and reads images_per_s from metrics.jsonl. Both
print the median ratio, its spread (min-max over rounds) and the load average before and after,
with a warning when the machine was busy (others' load makes every figure noisy).

    python scripts/bench_adder.py [--quick] [--json PATH] [--repeats N] [--threads N]
                                  [--no-layers] [--step-rounds N] [--train-rounds N] [--train-size N]
                                  [--system-malloc]

--kernels ISA,ISA,... prints only the float kernels' throughput instead: forward, input gradient, and input
gradient with the weight gradient's product term summed in the same tiles (grad_in+w: what a training step calls
for a weight of up to cpu.FUSED_WEIGHT_BYTES, docs/adder_layer.md) of each ResNet-20 shape (and the r50 ones
unless --quick) called directly, float32, on one thread, in thread CPU time, the instruction sets
(ADDERNET_CPU_ISA, docs/adder_layer.md) interleaved per round; G elements/s with elements = N x Cout x Cin x kh x
kw x Ho x Wo, median and min-max over --repeats.
Divide by scripts/cpu_peak.c's peak of the mix for the share of peak (docs/benchmarks.md). The last column
is the weight gradient (torch's convolution weight gradient and the W sum(g) term, the same on every
instruction set of this package's kernels): divide by the FMA peak.

--channels-last runs the whole-step timing with both twins and their batches in channels-last memory format
(trainer.channels_last=true).

    python scripts/bench_adder.py --kernels native,avx2 [--quick] [--repeats N] [--against CHECKOUT]
    python scripts/bench_adder.py --against CHECKOUT [--step-rounds N] [--step-batches 64,128] [--threads N]

--against CHECKOUT adds another version's C kernels (a checkout, e.g. a `git worktree`), built from its sources
and called in turn with this tree's in every round, with the median of the per-round ratios: a before/after
comparison in one process, which a machine whose speed drifts between processes cannot spoil. Only the C kernels
differ; the Python around them is this tree's, so the two versions must share their functions and structs. With
--kernels it times the kernels; without, the whole ResNet-20 training step (AdderNet with each version's kernels
and the CNN twin in turn in one process, --step-rounds rounds of --repeats steps, at each of --step-batches),
printing the step times and the ratios this/other, this/twin and other/twin.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

from addernet import AdaptiveLR, Adder2d
from addernet.analysis.layer_shapes import RESNET20 as R20
from addernet.analysis.layer_shapes import with_batch
from addernet.checks import json_with, output_file
from addernet.engine.allocator import M_MMAP_THRESHOLD, mallopt
from addernet.errors import reported
from addernet.models import build_model
from addernet.ops.adder2d import grad_weight
from addernet.ops.kernels import build, cpu
from addernet.tools.bench import busy, kernel_sources, ratio_summary, ref_estimate_gb, set_env, timing_allocator

ROOT = Path(__file__).resolve().parents[1]
# (name, batch, in, out, size, kernel, stride, padding): every ResNet-20 shape at batch 64, five ResNet-50 at 8
RESNET20 = with_batch([row[0] for row in R20], 64)
RESNET50 = with_batch(
    ["r50 64->64 56x56", "r50 1x1 256->64 56x56", "r50 128->128 28x28", "r50 256->256 14x14", "r50 512->512 7x7"], 8
)


def _status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _pin_malloc():
    """Make glibc return every large freed block to the OS so RSS tracks live memory."""
    return mallopt(M_MMAP_THRESHOLD, 1 << 16)  # 64 KiB, disables the dynamic threshold


def _make(method, cin, cout, k, s, p):
    if method == "conv":
        return nn.Conv2d(cin, cout, k, s, p, bias=False)
    return Adder2d(cin, cout, k, s, p)


def _step(method, layer, x, g):
    os.environ["ADDERNET_BACKEND"] = "fast" if method == "conv" else method
    x.grad, layer.weight.grad = None, None
    layer(x).backward(g)


def _peak_mb(method, layer, x, g):
    x.grad, layer.weight.grad = None, None
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _status("VmRSS")
    _step(method, layer, x, g)
    peak = _status("VmHWM") - base
    x.grad, layer.weight.grad = None, None
    return peak / 2**20


def _layer_case(shape, ref_limit_gb):
    """The methods timed for one shape, their layers, an input, an output gradient and the reference's estimated
    peak (GB)."""
    name, n, cin, cout, size, k, s, p = shape
    torch.manual_seed(0)
    x = torch.randn(n, cin, size, size, requires_grad=True)
    ref_gb = ref_estimate_gb(n, cin, cout, size, k, s, p)
    methods = ["fast", "conv"] + (["reference"] if ref_gb <= ref_limit_gb else [])
    layers = {m: _make(m, cin, cout, k, s, p) for m in methods}
    with torch.no_grad():
        g = torch.randn_like(layers["conv"](x))
    return methods, layers, x, g, ref_gb


def peak_memory(shapes, ref_limit_gb):
    """{"pinned": whether glibc's mmap threshold could be pinned, "mb": {shape name: {method: peak MiB}}}: run in a
    fresh process (memory_child)."""
    pinned = _pin_malloc()
    out = {}
    for shape in shapes:
        methods, layers, x, g, _ = _layer_case(shape, ref_limit_gb)
        for m in methods:  # the first step builds the kernels and sizes the library workspaces
            _step(m, layers[m], x, g)
        out[shape[0]] = {m: _peak_mb(m, layers[m], x, g) for m in methods}
    return {"pinned": pinned, "mb": out}


def memory_child(quick, ref_limit_gb, threads):
    """peak_memory in a fresh process (the timing process keeps the allocator it times with)."""
    cmd = [sys.executable, __file__, "--child-memory", "--ref-limit-gb", str(ref_limit_gb)] + ["--quick"] * quick
    cmd += ["--threads", str(threads)] if threads else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), cwd=ROOT)
    if out.returncode:
        sys.exit(f"memory child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(shapes, repeats, ref_limit_gb, ref_repeats, memory):
    rows = []
    for shape in shapes:
        name, n, cin, cout, size, k, s, p = shape
        methods, layers, x, g, ref_gb = _layer_case(shape, ref_limit_gb)
        times = {m: [] for m in methods}
        cpu = {m: [] for m in methods}
        for m in methods:  # warm-up (and kernel build)
            _step(m, layers[m], x, g)
        for r in range(repeats):
            for m in methods:
                if m == "reference" and r >= ref_repeats:
                    continue
                t, c = time.perf_counter(), time.process_time()
                _step(m, layers[m], x, g)
                times[m].append((time.perf_counter() - t) * 1e3)
                cpu[m].append((time.process_time() - c) * 1e3)
        row = {
            "shape": name,
            "batch": n,
            "in": cin,
            "out": cout,
            "size": size,
            "kernel": k,
            "stride": s,
            "padding": p,
            "reference_estimate_gb": round(ref_gb, 2),
        }
        for m in methods:
            ts = sorted(times[m])
            q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
            row[f"{m}_ms"] = statistics.median(ts)
            row[f"{m}_spread"] = (q[2] - q[0]) / q[1]
            row[f"{m}_cpu_ms"] = statistics.median(cpu[m])
            row[f"{m}_peak_mb"] = memory[name][m]
        row["fast_over_conv"] = row["fast_ms"] / row["conv_ms"]
        row["fast_over_conv_cpu"] = row["fast_cpu_ms"] / row["conv_cpu_ms"]
        row["fast_over_conv_mem"] = row["fast_peak_mb"] / max(row["conv_peak_mb"], 1e-9)
        row["reference_over_fast"] = row["reference_ms"] / row["fast_ms"] if "reference_ms" in row else None
        rows.append(row)
        print(_format_row(row), flush=True)
    return rows


def kernel_throughput(shapes, isas, repeats, against=None):
    """Print G elements/s of cpu.forward and cpu.grad_input per shape and instruction set (1 thread, thread CPU
    time, the instruction sets interleaved in each round). With ``against`` (another checkout) its C kernels run
    too, built from its sources (ADDERNET_KERNEL_SOURCES) and called in turn with this tree's in every round (the
    order alternating), and each pair gets the median of its per-round ratios (this tree's rate over the other's)."""
    torch.set_num_threads(1)
    sources = {"": None}
    if against:
        sources["other"] = kernel_sources(against)
        print(f"# other: the kernels of {sources['other']}; ratio: this tree's rate / the other's, per round")
    print(f"# float kernels, float32, 1 thread, thread CPU time, median (min-max) of {repeats} | {build.machine(1)}")
    heads = []
    for i in isas:
        for c in ("fwd", "grad_in", "grad_in+w"):
            heads += [f"{i} {c} G/s"] + ([f"{i} other {c}", "ratio"] if against else [])
    print("| shape | batch | " + " | ".join(heads) + " | grad_w G/s |")
    print("|---|---" + "|---" * len(heads) + "|---|")
    for name, n, cin, cout, size, k, s, p in shapes:
        torch.manual_seed(0)
        x, w = torch.randn(n, cin, size, size), torch.randn(cout, cin, k, k)
        conf = ((s, s), (p, p), (1, 1), 1)
        g = torch.randn_like(cpu.forward(x, w, *conf))
        work = g.numel() * cin * k * k / 1e9
        calls = {
            "fwd": lambda: cpu.forward(x, w, *conf),
            "gin": lambda: cpu.grad_input(x, w, g, *conf),
            "giw": lambda: cpu.grad_input_weight(x, w, g, *conf),
        }
        rates = {(i, c, v): [] for i in isas for c in calls for v in sources} | {"wgrad": []}
        for r in range(repeats + 1):  # the first round builds the kernels and warms the caches
            for i in isas:
                os.environ["ADDERNET_CPU_ISA"] = i
                for c, fn in calls.items():
                    for v, src in sorted(sources.items(), reverse=r % 2 == 0):  # A B, then B A
                        set_env("ADDERNET_KERNEL_SOURCES", src)
                        t = time.thread_time()
                        fn()
                        if r:
                            rates[i, c, v].append(work / (time.thread_time() - t))
                    set_env("ADDERNET_KERNEL_SOURCES", None)
            t = time.thread_time()
            grad_weight(x, w, g, *conf)
            if r:
                rates["wgrad"].append(work / (time.thread_time() - t))
        cells = []
        for i in isas:
            for c in calls:
                cells += [_median_range(rates[i, c, v]) for v in sources]
                if against:
                    ratios = [a / b for a, b in zip(rates[i, c, ""], rates[i, c, "other"])]
                    cells.append(f"{statistics.median(ratios):.2f}")
        print(f"| {name} | {n} | " + " | ".join(cells + [_median_range(rates["wgrad"])]) + " |", flush=True)
    os.environ.pop("ADDERNET_CPU_ISA")
    print(f"# after: {build.machine(1)}")


def _median_range(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"


def _training_step(layer, batch, channels_last=False):
    """A function running one ResNet-20 training step (forward, backward, adaptive LR, SGD) of `layer` (adder on the
    fast backend, or conv: the CNN twin) on a fixed CIFAR-sized batch."""
    os.environ["ADDERNET_BACKEND"] = "fast"
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, y = torch.randn(batch, 3, 32, 32).to(memory_format=fmt), torch.randint(0, 10, (batch,))
    model = build_model("resnet20", layer).train().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    if layer == "adder":
        AdaptiveLR(model, 0.2).attach(opt)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def model_step(batch, repeats, layers=("adder", "conv"), channels_last=False):
    """Median ms of one whole ResNet-20 training step, AdderNet on the fast backend vs its CNN twin."""
    out = {}
    for layer in layers:
        step = _training_step(layer, batch, channels_last)
        times, cpu = [], []
        for r in range(repeats + 2):  # two warm-up steps
            t, c = time.perf_counter(), time.process_time()
            step()
            times.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
        out[layer] = statistics.median(times[2:])
        out[layer + "_cpu"] = statistics.median(cpu[2:])
    return out


def step_against(batch, rounds, repeats, against):
    """Whole-step wall ms, in this one process, of the AdderNet with this tree's C kernels, with another checkout's
    (ADDERNET_KERNEL_SOURCES: the Python is this tree's) and of the CNN twin, in turn (the order reversed every other
    round), each the median of `repeats` steps after one warm-up step. Prints them and the per-round ratios."""
    other = kernel_sources(against)
    sides = {"this": ("adder", None), "other": ("adder", other), "twin": ("conv", None)}
    steps = {name: _training_step(layer, batch) for name, (layer, _) in sides.items()}
    ms = {name: [] for name in sides}
    for r in range(rounds):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            set_env("ADDERNET_KERNEL_SOURCES", sides[name][1])
            steps[name]()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                steps[name]()
                times.append((time.perf_counter() - t) * 1e3)
            ms[name].append(statistics.median(times))
        set_env("ADDERNET_KERNEL_SOURCES", None)

    pairs = {"this/other": ("this", "other"), "this/twin": ("this", "twin"), "other/twin": ("other", "twin")}
    rs = {k: [x / y for x, y in zip(ms[a], ms[b])] for k, (a, b) in pairs.items()}
    print(
        f"# whole ResNet-20 training step, batch {batch}, wall ms, one process, {rounds} rounds: AdderNet "
        f"{statistics.median(ms['this']):.1f} with this tree's kernels, {statistics.median(ms['other']):.1f} with "
        f"{other}'s, CNN twin {statistics.median(ms['twin']):.1f}; "
        + "; ".join(f"{k} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in rs.items()),
        flush=True,
    )


def _child_env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "ADDERNET_BACKEND": "fast"}


def _print_summary(r, what):
    print(
        f"# {r['label']}: AdderNet {r['adder']:.1f} {r['unit']}, CNN twin {r['conv']:.1f} {r['unit']}, "
        f"{what} {r['ratio']:.2f} (rounds {r['rounds']}, range {r['ratio_min']:.2f}-{r['ratio_max']:.2f})",
        flush=True,
    )


def step_ratio(batch, rounds, repeats, threads, channels_last=False, system_malloc=False):
    """Whole-step ms of both twins, each in a fresh subprocess, interleaved A B A B."""
    times = {"adder": [], "conv": []}
    cpu = {"adder": [], "conv": []}
    for _ in range(rounds):
        for layer in ("adder", "conv"):
            cmd = [sys.executable, __file__, "--child-step", layer, "--batch", str(batch), "--repeats", str(repeats)]
            if threads:
                cmd += ["--threads", str(threads)]
            if channels_last:
                cmd += ["--channels-last"]
            if system_malloc:
                cmd += ["--system-malloc"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), cwd=ROOT)
            if out.returncode:
                sys.exit(f"whole-step child ({layer}, batch {batch}) failed:\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            times[layer].append(res["ms"])
            cpu[layer].append(res["cpu_ms"])
    return (
        ratio_summary(
            f"whole ResNet-20 training step, batch {batch}, wall ms", times["adder"], times["conv"], "ms", True
        ),
        ratio_summary(
            f"whole ResNet-20 training step, batch {batch}, process CPU ms", cpu["adder"], cpu["conv"], "ms", True
        ),
    )


def train_ratio(rounds, train_size, batch, system_malloc=False):
    """images/s of `python train.py data=fake` for both twins, interleaved A B A B."""
    ips = {"adder": [], "conv": []}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        for r in range(rounds):
            for layer in ("adder", "conv"):
                run = Path(tmp) / f"{layer}{r}"
                cmd = [
                    sys.executable,
                    str(ROOT / "train.py"),
                    "data=fake",
                    f"data.train_size={train_size}",
                    f"data.batch_size={batch}",
                    "trainer.epochs=1",
                    f"model.layer={layer}",
                    f"hydra.run.dir={run}",
                ] + (["trainer.retain_freed_memory=false"] if system_malloc else [])
                out = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), cwd=ROOT)
                metrics = run / "metrics.jsonl"
                if out.returncode or not metrics.exists():
                    sys.exit(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
                ips[layer].append(json.loads(metrics.read_text().splitlines()[-1])["images_per_s"])
    return ratio_summary(
        f"train.py data=fake data.train_size={train_size} data.batch_size={batch} trainer.epochs=1, images/s",
        ips["adder"],
        ips["conv"],
        "images/s",
        False,
    )


HEADER = (
    "| shape | batch | fast ms | reference ms | conv ms | fast/conv | ref/fast | fast/conv CPU time "
    "| fast MB | ref MB | conv MB | fast/conv mem |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _format_row(r):
    def f(key, fmt):
        return format(r[key], fmt) if r.get(key) is not None else "skipped"

    return (
        f"| {r['shape']} | {r['batch']} | {f('fast_ms', '.1f')} (±{r['fast_spread'] * 50:.0f}%) | "
        f"{f('reference_ms', '.0f')} | {f('conv_ms', '.1f')} (±{r['conv_spread'] * 50:.0f}%) | "
        f"{f('fast_over_conv', '.2f')} | {f('reference_over_fast', '.0f')} | {f('fast_over_conv_cpu', '.2f')} | "
        f"{f('fast_peak_mb', '.1f')} | "
        f"{f('reference_peak_mb', '.0f')} | {f('conv_peak_mb', '.1f')} | {f('fast_over_conv_mem', '.2f')} |"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="three ResNet-20 shapes, fewer repeats")
    ap.add_argument("--json", type=Path, help="write the results to this JSON file")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per shape (default 15, quick 5)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--ref-repeats", type=int, default=3, help="timed rounds of the slow reference")
    ap.add_argument(
        "--ref-limit-gb",
        type=float,
        default=4.0,
        help="skip the reference where its estimated peak memory exceeds this",
    )
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
    ap.add_argument("--step-rounds", type=int, default=5, help="interleaved rounds of the whole-step timing (0: skip)")
    ap.add_argument("--train-rounds", type=int, default=3, help="interleaved rounds of train.py (0: skip)")
    ap.add_argument("--train-size", type=int, default=2560, help="FakeData images per train.py epoch")
    ap.add_argument("--kernels", help="only the float kernels' throughput for these instruction sets, e.g. native,avx2")
    ap.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="another checkout's C kernels too, in this process: with --kernels their table, else the whole step",
    )
    ap.add_argument(
        "--step-batches", type=lambda v: [int(b) for b in v.split(",")], default=[64, 128], help="whole-step batches"
    )
    ap.add_argument("--channels-last", action="store_true", help="whole-step timing in channels-last memory format")
    ap.add_argument(
        "--system-malloc", action="store_true", help="time with the C library's allocator defaults, not train.py's"
    )
    ap.add_argument("--child-step", choices=("adder", "conv"), help=argparse.SUPPRESS)
    ap.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--overwrite", action="store_true", help="let --json replace a file this script did not write")
    args = ap.parse_args()
    if args.json:
        output_file(args.json, "--json", json_with("meta", "rows"), args.overwrite)
    if args.child_step:  # one side of the whole-step timing, in this fresh process
        timing_allocator(args.system_malloc)
        if args.threads:
            torch.set_num_threads(args.threads)
        step = model_step(args.batch, args.repeats or 5, (args.child_step,), args.channels_last)
        print(json.dumps({"ms": step[args.child_step], "cpu_ms": step[args.child_step + "_cpu"]}))
        return
    shapes = [RESNET20[0], RESNET20[4], RESNET20[5]] if args.quick else RESNET20 + RESNET50
    if args.child_memory:  # the memory column, in this fresh process
        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(peak_memory(shapes, args.ref_limit_gb)))
        return
    repeats = args.repeats or (5 if args.quick else 15)
    if args.against and not Path(kernel_sources(args.against)).is_dir():
        ap.error(f"--against needs a checkout of this repository; got {args.against!r}")
    if args.against and not (args.kernels or args.step_rounds):
        ap.error("--against compares the kernels (--kernels ISA) or the whole step (--step-rounds N, not 0)")
    allocator = timing_allocator(args.system_malloc)
    if args.kernels:
        shapes = RESNET20 if args.quick else RESNET20 + RESNET50
        return kernel_throughput(shapes, args.kernels.split(","), repeats, args.against)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.against:
        print(f"# {build.machine(torch.get_num_threads())}")
        for batch in args.step_batches:
            step_against(batch, args.step_rounds, args.repeats or (3 if args.quick else 5), args.against)
        print(f"# load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        return
    memory = None if args.no_layers else memory_child(args.quick, args.ref_limit_gb, args.threads)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "repeats": repeats,
        "memory_measured": memory is not None and memory["pinned"],  # with RSS tracking live memory
        "load_before": os.getloadavg(),
        "allocator": allocator,
    }
    print(f"# {meta['date']}  torch {meta['torch']}  repeats {repeats}  {build.machine(meta['threads'])}")
    print(f"# allocator: {allocator}")
    print("# times: median fwd+bwd wall ms (± half the interquartile range); memory: peak RSS rise, MiB")
    print(HEADER)
    ref_repeats = min(args.ref_repeats, repeats)
    rows = [] if args.no_layers else bench(shapes, repeats, args.ref_limit_gb, ref_repeats, memory["mb"])
    summaries = []
    for batch in args.step_batches if args.step_rounds else ():
        for r in step_ratio(
            batch, args.step_rounds, 5 if args.quick else 10, args.threads, args.channels_last, args.system_malloc
        ):
            summaries.append(r)
            _print_summary(r, "ratio (target <= 1.3)")
    if args.train_rounds:
        summaries.append(train_ratio(args.train_rounds, args.train_size, 128, args.system_malloc))
        _print_summary(summaries[-1], "CNN/AdderNet throughput ratio (target <= 1.3)")
    meta["whole_step"] = summaries
    meta["load_after"] = os.getloadavg()
    meta["busy"] = busy(meta["load_before"], meta["load_after"])
    print(f"# loadavg before {meta['load_before'][0]:.2f}, after {meta['load_after'][0]:.2f} (1 min)")
    if meta["busy"]:
        print(
            f"# WARNING: the machine was busy (loadavg {meta['load_before'][0]:.1f} before, "
            f"{meta['load_after'][0]:.1f} after, {os.cpu_count()} CPUs): other processes shared the cores, "
            "so these times are inflated and noisy; the interleaved ratios are the figures to trust",
            flush=True,
        )
    r20 = [r for r in rows if r["shape"].startswith("r20")]
    refs = [r["reference_over_fast"] for r in rows if r["reference_over_fast"]]
    if r20:
        print(
            f"# ResNet-20 worst fast/conv time {max(r['fast_over_conv'] for r in r20):.2f} (target <= 3; "
            f"CPU time {max(r['fast_over_conv_cpu'] for r in r20):.2f}), "
            f"worst fast/conv memory {max(r['fast_over_conv_mem'] for r in r20):.2f} (target <= 2), "
            f"min reference/fast {min(refs) if refs else float('nan'):.0f} (target >= 50)"
        )
    r50 = [r for r in rows if r["shape"].startswith("r50")]
    if r50:
        print(
            f"# ResNet-50 worst fast/conv time {max(r['fast_over_conv'] for r in r50):.2f} (target <= 2.0; "
            f"CPU time {max(r['fast_over_conv_cpu'] for r in r50):.2f})"
        )
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    with reported("bench_adder.py"):
        main()
