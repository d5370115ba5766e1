"""One training epoch through the tensor-resident path (data.on_device=true) against torchvision's PIL path.

Runs what a user runs: ``python train.py experiment=<preset> trainer.epochs=1`` in a fresh process per
epoch, the two paths interleaved A B A B over --rounds rounds, and reads each epoch's training time
(``epoch_seconds``, validation excluded) and images/s from the run's metrics.jsonl. Prints one line per
run, the median and range per path, the load average before and after, and a JSON summary last.

    python scripts/bench_data_path.py --data-root ../shared/mnist            # LeNet-5-BN AdderNet on MNIST
    python scripts/bench_data_path.py --preset mnist_lenet5_bn_cnn --rounds 3 --threads 1

``--stats`` instead compares what the two paths feed the model: per-channel mean and standard deviation,
minimum, maximum and the share of zero-padding pixels of one epoch of training batches (same seed and
epoch), e.g. ``--stats --preset cifar10_resnet20_cnn data=cifar10_folder`` on a CIFAR image folder.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from addernet.errors import reported
from addernet.tools.bench import describe, load, metadata

ROOT = Path(__file__).resolve().parents[1]


def one_epoch(preset, data_root, on_device, run_dir, threads, extra):
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        f"experiment={preset}",
        f"data.root={data_root}",
        "data.download=false",
        f"data.on_device={on_device}",
        "trainer.epochs=1",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    metrics = Path(run_dir) / "metrics.jsonl"
    if out.returncode or not metrics.exists():
        sys.exit(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    record = json.loads(metrics.read_text().splitlines()[-1])
    return record["epoch_seconds"], record["images_per_s"]


def batch_stats(preset, data_root, extra):
    """Per-channel statistics of one epoch of training batches through each path (seed 0, epoch 0)."""
    import torch
    from hydra import compose, initialize_config_dir

    from addernet.data import build_loader, seed_epoch

    out = {}
    for on_device in ("true", "false"):
        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(
                "train",
                overrides=[
                    f"experiment={preset}",
                    f"data.root={data_root}",
                    "data.download=false",
                    f"data.on_device={on_device}",
                    "data.num_workers=0",
                    *extra,
                ],
            )
        loader = build_loader(cfg.data, "train", seed=0)
        seed_epoch(loader, 0, 0)
        x = torch.cat([images for images, _ in loader]).double()
        pad = (-torch.tensor(list(cfg.data.mean)) / torch.tensor(list(cfg.data.std))).double().view(1, -1, 1, 1)
        out[on_device] = {
            "n": len(x),
            "mean": x.mean((0, 2, 3)).tolist(),
            "std": x.std((0, 2, 3)).tolist(),
            "min": x.amin((0, 2, 3)).tolist(),
            "max": x.amax((0, 2, 3)).tolist(),
            "padding_share": float((x - pad).abs().lt(1e-6).all(1).double().mean()),
        }
        print(f"data.on_device={on_device}: " + json.dumps(out[on_device]), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="mnist_lenet5_bn_adder", help="experiment preset (default: %(default)s)")
    ap.add_argument("--data-root", default="../shared/mnist", help="data.root (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each run (default: torch's)")
    ap.add_argument("--stats", action="store_true", help="compare the batches' statistics instead of timing")
    ap.add_argument("extra", nargs="*", help="further overrides for train.py")
    args = ap.parse_args()
    if args.stats:
        print(json.dumps(batch_stats(args.preset, os.path.abspath(args.data_root), args.extra)))
        return
    results = {"true": [], "false": []}
    before = load()
    machine = metadata(args.threads)
    print(f"# {describe(machine)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        for r in range(args.rounds):
            for on_device in ("true", "false"):
                seconds, ips = one_epoch(
                    args.preset,
                    os.path.abspath(args.data_root),
                    on_device,
                    Path(tmp) / f"{on_device}{r}",
                    args.threads,
                    args.extra,
                )
                results[on_device].append((seconds, ips))
                print(
                    f"round {r + 1} data.on_device={on_device}: epoch {seconds:.1f} s, {ips:.0f} images/s", flush=True
                )
    after = load()
    summary = {
        "preset": args.preset,
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": machine,
        "load_before": before,
        "load_after": after,
    }
    for on_device, name in (("true", "tensor_resident"), ("false", "pil")):
        secs = [s for s, _ in results[on_device]]
        ips = [i for _, i in results[on_device]]
        summary[name] = {
            "epoch_s_median": statistics.median(secs),
            "epoch_s_min": min(secs),
            "epoch_s_max": max(secs),
            "images_per_s_median": statistics.median(ips),
            "epoch_s_all": secs,
        }
        print(
            f"# data.on_device={on_device}: epoch median {statistics.median(secs):.1f} s "
            f"(range {min(secs):.1f}-{max(secs):.1f}), {statistics.median(ips):.0f} images/s"
        )
    ratios = [p / t for (t, _), (p, _) in zip(results["true"], results["false"])]
    summary["speedup_median"], summary["speedup_range"] = statistics.median(ratios), [min(ratios), max(ratios)]
    print(
        f"# PIL / tensor-resident epoch time: median {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}); load average before {before}, after {after}"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    with reported("bench_data_path.py"):
        main()
