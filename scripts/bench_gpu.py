"""GPU benchmark of the Triton adder kernels against cuDNN convolution (fp32, TF32 off).

Per adder-layer shape (ResNet-20 at batch 256, ResNet-50 at batch 64): median time (CUDA events)
of the forward of the Triton kernel, the unfold reference (when its estimated memory fits) and
cuDNN conv2d; forward+backward of adder2d (fast backend: Triton forward and input gradient, cuDNN
weight-gradient identity) vs conv2d, with the peak memory each adds; the input-gradient kernel
alone; forward throughput in GOPS counting the paper's 2 ops (|x - w| and the add) per
multiply-accumulate position, as a share of the FP32 CUDA-core peak (SMs x 128 lanes x 2 x clock)
and of the adder's issue bound (half that: 2 instructions per position, where an FMA is 1).
Then one ResNet-20 training step (forward + backward + SGD, batch 256), adder vs its CNN twin, eager (with the
host's time to issue it and the GPU's busy time) and with CUDA graphs (trainer.cuda_graph). Per-tile timings of
the forward/input-gradient on a few shapes go to the JSON (tuning data).

    python scripts/bench_gpu.py [--quick] [--step-only] [--json PATH]      (JSON also to $OUT/bench_gpu.json)
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
import torch.nn.functional as F

from addernet.analysis.layer_shapes import RESNET20 as R20
from addernet.analysis.layer_shapes import RESNET50 as R50
from addernet.analysis.layer_shapes import with_batch
from addernet.checks import json_with, output_file
from addernet.errors import reported
from addernet.tools.bench import ref_estimate_gb

# (name, batch, cin, cout, size, kernel, stride, padding): ResNet-20 at batch 256, ResNet-50 at 64
RESNET20 = with_batch([row[0] for row in R20[:6]], 256)
RESNET50 = with_batch([row[0] for row in R50[:9]], 64)
TILE_SHAPES = ["r20 16->16 32x32", "r20 64->64 8x8", "r50 64->64 56x56", "r50 256->256 14x14"]
REF_LIMIT_GB = 24.0


def timeit(fn, warmup, reps):
    """Median milliseconds of fn over reps, CUDA events around each call, after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def host_ms(fn, reps=10):
    """Median milliseconds the host takes to issue fn on an idle GPU (perf_counter from a synchronised start to fn's
    return): a step whose host time is its CUDA-event time is bound by the host."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def busy_ms(fn, reps=5):
    """Milliseconds per call fn keeps the GPU busy: its kernels' time in torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / reps


def peak_mb(fn):
    """Peak memory fn allocates above what is live before it (torch.cuda.max_memory_allocated)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def sm_clock_mhz(props):
    """Max SM clock: device properties (kHz) if torch has it, else nvidia-smi, else H200's 1980."""
    khz = getattr(props, "clock_rate", 0)
    if khz:
        return khz / 1000, "torch device properties"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split()
        return float(out[0]), "nvidia-smi clocks.max.sm"
    except Exception:  # noqa: BLE001 - any failure: fall back to the documented value
        return 1980.0, "assumed (H200 SXM boost clock)"


def bench_layer(spec, tk, adder2d, reference, warmup, reps, peak_ops):
    name, n, cin, cout, size, k, s, p = spec
    conf = ((s, s), (p, p), (1, 1), 1)
    x = torch.randn(n, cin, size, size, device="cuda")
    w = torch.randn(cout, cin, k, k, device="cuda")
    y = tk.forward(x, w, *conf)  # also autotunes
    g = torch.randn_like(y)
    ops = 2 * y.numel() * cin * k * k  # 2 ops per (output, reduction) position
    r = dict(name=name, batch=n, cin=cin, cout=cout, size=size, k=k, stride=s, ops=ops)
    r["fwd_ms"] = timeit(lambda: tk.forward(x, w, *conf), warmup, reps)
    r["fwd_conv_ms"] = timeit(lambda: F.conv2d(x, w, None, s, p), warmup, reps)
    r["dgrad_ms"] = timeit(lambda: tk.grad_input(x, w, g, *conf), warmup, reps)
    r["gops"] = ops / r["fwd_ms"] / 1e6
    r["pct_peak"] = 100 * ops / (r["fwd_ms"] * 1e-3) / peak_ops
    r["pct_issue"] = 2 * r["pct_peak"]
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def adder_step():
        adder2d(xr, wr, None, s, p).backward(g)

    def conv_step():
        F.conv2d(xr, wr, None, s, p).backward(g)

    r["fwdbwd_ms"] = timeit(adder_step, warmup, reps)
    r["fwdbwd_conv_ms"] = timeit(conv_step, warmup, reps)
    xr.grad = wr.grad = None
    r["fwdbwd_mb"] = peak_mb(adder_step)
    xr.grad = wr.grad = None
    r["fwdbwd_conv_mb"] = peak_mb(conv_step)
    xr.grad = wr.grad = None
    r["ref_fwd_ms"] = r["ref_fwdbwd_mb"] = None
    if ref_estimate_gb(n, cin, cout, size, k, s, p) < REF_LIMIT_GB:
        try:
            r["ref_fwd_ms"] = timeit(lambda: reference(x, w, *conf), 1, 3)
            r["ref_fwdbwd_mb"] = peak_mb(lambda: reference(xr, wr, *conf).backward(g))
        except torch.cuda.OutOfMemoryError:
            pass
        xr.grad = wr.grad = None
    torch.cuda.empty_cache()
    return r


def bench_tiles(spec, tk, warmup, reps):
    """Forward / input-gradient time of every tile config on one shape (autotuner's choices)."""
    name, n, cin, cout, size, k, s, p = spec
    conf = ((s, s), (p, p), (1, 1), 1)
    x = torch.randn(n, cin, size, size, device="cuda")
    w = torch.randn(cout, cin, k, k, device="cuda")
    g = torch.randn_like(tk.forward(x, w, *conf))
    out = {}
    for kind, cfgs, fn in (
        ("fwd", tk._FWD_CONFIGS, lambda c: tk.forward(x, w, *conf, config=c)),
        ("dgrad", tk._DGRAD_CONFIGS, lambda c: tk.grad_input(x, w, g, *conf, config=c)),
    ):
        for c in cfgs:
            out[f"{kind} {','.join(map(str, c))}"] = round(timeit(lambda: fn(c), warmup, reps), 4)
    return out


def train_step_bench(batch, warmup, reps):
    """One ResNet-20 SGD step (fwd + bwd + adaptive LR + update) on random CIFAR-sized data: adder vs conv twin,
    each as it runs eagerly and with its forward and backward replayed as CUDA graphs (trainer.cuda_graph)."""
    try:
        from addernet.cuda_graph import CudaGraphed
        from addernet.models import build_model
    except ImportError as e:
        return {"error": f"addernet.models.build_model unavailable ({e}); skipped the training step"}
    res = {}
    for layer in ("adder", "conv"):
        torch.manual_seed(0)
        model = build_model("resnet20", layer=layer).cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        if layer == "adder":  # a real AdderNet step includes the adaptive learning rate
            from addernet import AdaptiveLR

            AdaptiveLR(model, 0.2).attach(opt)
        x = torch.randn(batch, 3, 32, 32, device="cuda")
        t = torch.randint(0, 10, (batch,), device="cuda")
        res[layer] = {}
        for mode, forward in (("eager", model), ("graph", CudaGraphed(model))):

            def step():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(forward(x), t).backward()
                opt.step()

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()  # from before the graphs are recorded: their memory pool counts
            ms = timeit(step, warmup, reps)
            torch.cuda.synchronize()
            res[layer][mode] = dict(ms=ms, peak_mb=torch.cuda.max_memory_allocated() / 2**20)
            if mode == "eager":  # where an eager step's time goes: issuing it, or the GPU's work
                res[layer][mode].update(host_ms=host_ms(step), busy_ms=busy_ms(step))
        model = opt = forward = None  # free this model (and its graphs) before the next one is built
        torch.cuda.empty_cache()
    adder, conv = res["adder"], res["conv"]
    res["time_ratio"] = adder["eager"]["ms"] / conv["eager"]["ms"]
    res["mem_ratio"] = adder["eager"]["peak_mb"] / conv["eager"]["peak_mb"]
    res["graph_time_ratio"] = adder["graph"]["ms"] / conv["graph"]["ms"]
    return res


def fmt(v, spec="{:.3f}"):
    return "-" if v is None else spec.format(v)


def main():
    ap = argparse.ArgumentParser(description="Triton adder kernels vs cuDNN on one GPU")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repeats (smoke run)")
    ap.add_argument("--step-only", action="store_true", help="only the ResNet-20 training step, no layer table")
    ap.add_argument("--json", default=None, help="write results here (default $OUT/bench_gpu.json if OUT is set)")
    ap.add_argument("--overwrite", action="store_true", help="let --json replace a file this script did not write")
    a = ap.parse_args()
    out = a.json or (os.path.join(os.environ["OUT"], "bench_gpu.json") if os.environ.get("OUT") else None)
    if out:
        output_file(out, "--json", json_with("env", "layers", "tiles"), a.overwrite)
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    import addernet
    from addernet.ops.kernels import triton as tk
    from addernet.ops.reference import adder2d_reference

    if not tk.available():
        sys.exit("the Triton adder kernels report unavailable on this GPU (needs compute capability >= 7.5)")
    os.environ.setdefault("ADDERNET_BACKEND", "fast")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True

    props = torch.cuda.get_device_properties(0)
    mhz, clock_src = sm_clock_mhz(props)
    peak_ops = props.multi_processor_count * 128 * 2 * mhz * 1e6
    env = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=props.name,
        sms=props.multi_processor_count,
        sm_clock_mhz=mhz,
        clock_source=clock_src,
        fp32_peak_tflops=peak_ops / 1e12,
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        tf32=False,
        lanes_first=tk.LANES_FIRST,
    )
    print(
        f"# {env['gpu']}: {env['sms']} SMs x 128 FP32 lanes x 2 x {mhz:.0f} MHz ({clock_src}) = "
        f"{env['fp32_peak_tflops']:.1f} TFLOP/s FP32 peak; adder issue bound = half (2 instr/position)"
    )
    print(
        f"# torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']} (lanes-first tile order: "
        f"{env['lanes_first']}), TF32 off, cudnn.benchmark on"
    )

    warmup, reps = (2, 5) if a.quick else (3, 15)
    shapes = [] if a.step_only else RESNET20[:2] + RESNET50[:2] if a.quick else RESNET20 + RESNET50
    rows = []
    t0 = time.time()
    hdr = (
        f"{'layer':26} {'fwd ms':>8} {'conv ms':>8} {'ref ms':>8} {'GOPS':>7} {'%peak':>6} {'%issue':>6} "
        f"{'dgrad ms':>8} {'f+b ms':>8} {'conv f+b':>8} {'f+b/conv':>8} {'MB':>7} {'conv MB':>7} {'ref MB':>7}"
    )
    print(hdr)
    for spec in shapes:
        r = bench_layer(spec, tk, addernet.adder2d, adder2d_reference, warmup, reps, peak_ops)
        rows.append(r)
        print(
            f"{r['name']:26} {r['fwd_ms']:8.3f} {r['fwd_conv_ms']:8.3f} {fmt(r['ref_fwd_ms']):>8} {r['gops']:7.0f} "
            f"{r['pct_peak']:6.1f} {r['pct_issue']:6.1f} {r['dgrad_ms']:8.3f} {r['fwdbwd_ms']:8.3f} "
            f"{r['fwdbwd_conv_ms']:8.3f} {r['fwdbwd_ms'] / r['fwdbwd_conv_ms']:8.2f} {r['fwdbwd_mb']:7.0f} "
            f"{r['fwdbwd_conv_mb']:7.0f} {fmt(r['ref_fwdbwd_mb'], '{:.0f}'):>7}",
            flush=True,
        )
    r50_3x3 = [r for r in rows if r["name"].startswith("r50 3x3") and r["stride"] == 1]
    if r50_3x3:
        pct = sum(r["ops"] for r in r50_3x3) / sum(r["ops"] / r["pct_peak"] for r in r50_3x3)
        print(f"# ResNet-50 3x3 (stride 1) forward, ops-weighted: {pct:.1f}% of FP32 peak (target >= 40%)")
    print(f"# layer table took {time.time() - t0:.0f} s (incl. Triton compilation and autotuning)")

    tiles = {}
    for spec in [s for s in shapes if s[0] in TILE_SHAPES]:
        tiles[spec[0]] = bench_tiles(spec, tk, 2, 5 if a.quick else 10)
        print(f"# tiles {spec[0]}: " + ", ".join(f"{k}={v:.3f}" for k, v in tiles[spec[0]].items()), flush=True)

    train = train_step_bench(64 if a.quick else 256, 2 if a.quick else 3, 5 if a.quick else 10)
    print("\n## ResNet-20 training step (fwd + bwd + SGD), batch", 64 if a.quick else 256)
    if "error" in train:
        print("#", train["error"])
    else:
        print(
            f"{'model':8} {'ms/step':>9} {'host ms':>8} {'busy ms':>8} {'peak MB':>9} "
            f"{'graphed ms':>11} {'graphed MB':>11}"
        )
        for layer in ("adder", "conv"):
            r, g = train[layer]["eager"], train[layer]["graph"]
            print(
                f"{layer:8} {r['ms']:9.2f} {r['host_ms']:8.2f} {r['busy_ms']:8.2f} {r['peak_mb']:9.0f} "
                f"{g['ms']:11.2f} {g['peak_mb']:11.0f}"
            )
        print(
            f"adder/conv: time {train['time_ratio']:.2f}x (target <= 3x), "
            f"peak memory {train['mem_ratio']:.2f}x (target <= 2x); "
            f"with CUDA graphs (trainer.cuda_graph) {train['graph_time_ratio']:.2f}x"
        )

    if out:
        Path(out).write_text(json.dumps(dict(env=env, layers=rows, tiles=tiles, train_step=train), indent=1))
        print("# wrote", out)


if __name__ == "__main__":
    with reported("bench_gpu.py"):
        main()
