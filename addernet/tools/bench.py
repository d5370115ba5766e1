"""What the benchmark scripts share: a fresh process per measurement, the load probe, medians of
interleaved rounds, the machine's metadata, and the reference kernel's memory estimate.

A figure is only comparable with its conditions, so every script prints :func:`metadata` (CPU model,
instruction set, threads, load) and warns through :func:`busy` when others shared the cores.
"""

import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ..ops.kernels import build

ROOT = Path(__file__).resolve().parents[2]


def kernel_sources(checkout):
    """The C kernels' folder of another checkout, for ADDERNET_KERNEL_SOURCES (build.py): a benchmark compares that
    version's kernels with this tree's in one process, the Python around them this tree's."""
    return str(Path(checkout).resolve() / "addernet" / "ops" / "kernels")


def set_env(name, value):
    """os.environ[name] = value, or unset for None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def load():
    """The 1-, 5- and 15-minute load averages (zeros where the OS has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def busy(load_before, load_after):
    """Others were running: the 1-minute load was already high before we started, or far above
    what one benchmark process adds afterwards."""
    n = os.cpu_count() or 1
    return load_before[0] > 0.5 * n or load_after[0] > 1.5 * n


def cpu_model():
    """(model name, instruction set: avx512 / avx2 / other) of this machine; "unknown" without /proc/cpuinfo."""
    name, flags = build.cpu_info()
    if not name and not flags:
        return "unknown", "unknown"
    return name or "?", "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


def metadata(threads=None):
    """Date, torch version, CPU model and instruction set, threads, CPUs and the load now."""
    import torch

    name, isa = cpu_model()
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cpu": name,
        "isa": isa,
        "cpus": os.cpu_count(),
        "threads": threads or torch.get_num_threads(),
        "load_before": load(),
    }


def describe(meta):
    """One line of :func:`metadata` for a benchmark's header."""
    return (
        f"{meta['date']}  {meta['cpu']} ({meta['isa']}), {meta['cpus']} CPUs, {meta['threads']} threads, "
        f"torch {meta['torch']}, load average {meta['load_before'][0]:.1f}"
    )


def median_iqr(values):
    """(median, first quartile, third quartile) of the values (a single value is all three)."""
    ts = sorted(values)
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return statistics.median(ts), q[0], q[2]


def ratio_summary(label, a, b, unit, lower_is_better):
    """Median and min-max of the per-round ratios a/b (time) or b/a (throughput) of interleaved rounds,
    as AdderNet (a) over its CNN twin (b): one round's load hits both sides alike."""
    ratios = [x / y if lower_is_better else y / x for x, y in zip(a, b)]
    return {
        "label": label,
        "adder": statistics.median(a),
        "conv": statistics.median(b),
        "unit": unit,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": len(ratios),
        "adder_all": a,
        "conv_all": b,
    }


def child_env(**extra):
    """The environment of a measurement's fresh process: this checkout first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def run_child(cmd, what, **env):
    """Run ``cmd`` in a fresh process (one side's allocations cannot slow the other) and return the JSON
    object on its last stdout line; exit with its stderr's tail when it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=child_env(**env))
    if out.returncode:
        sys.exit(f"{what} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ref_estimate_gb(n, cin, cout, size, k, s, p):
    """Peak memory of one fwd+bwd of the reference adder kernel (addernet/ops/reference.py), in GiB: three
    live N x Cout x Cin*k*k x L float32 blocks in its backward (X - W, its negation and the clamp of that;
    the forward holds two). Measured peak RSS rise: 3.03-3.07 blocks."""
    out = (size + 2 * p - k) // s + 1
    return 3 * n * cout * cin * k * k * out * out * 4 / 2**30


def timing_allocator(system_malloc=False):
    """Give this process the allocator train.py trains with (trainer.retain_freed_memory: glibc keeps freed memory
    for reuse), or with ``system_malloc`` leave the C library's defaults; returns which, for the header."""
    from ..engine.allocator import retain_freed_memory

    if system_malloc:
        return "the C library's defaults"
    return "freed memory retained, as train.py" if retain_freed_memory() else "the C library's defaults (not glibc)"
