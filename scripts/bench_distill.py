"""Distillation comparison on CIFAR-10 JPEGs: plain AdderNet, KD from the CNN twin, PKKD (+ ablations), CNN twin.

    python scripts/bench_distill.py --data ../shared/cifar10-jpeg [--model resnet20] [--epochs 20]
        [--batch-size 128] [--train-per-class N] [--test-per-class N] [--out outputs/bench_distill]

Runs, in this order, each one `train.py` run with the same schedule (SGD 0.1, cosine, --epochs):
  cnn            the CNN twin (model.layer=conv, no adaptive LR); its last.pt is the teacher of kd / pkkd_frozen
  adder          the plain AdderNet (task=classification, adaptive LR)
  kd             task=kd task.teacher=<cnn>/checkpoints/last.pt
  pkkd           task=pkkd (co-trained CNN twin, kernels on: the defaults)
  pkkd_nokernel  ablation: task.kernel=false
  pkkd_frozen    ablation: task.teacher=<cnn>/checkpoints/last.pt (frozen pretrained teacher)
A slice (--train-per-class / --test-per-class > 0) is made of symlinks to the first N files of each class.
Re-running resumes unfinished runs and skips finished ones. Then every method's step time is measured in
separate processes, interleaved (cnn adder kd ... cnn adder kd ...) for --rounds rounds on one fixed
synthetic batch (training step only: forward, backward, optimizer step), reporting median and spread and
the load average before/after; peak memory is the rise of the process's peak RSS over those steps (CPU)
or torch.cuda.max_memory_allocated (CUDA). Writes OUT/results.json, OUT/results.md and OUT/curves.png
(scripts/plot_curves.py). Top-1 is the final epoch's validation accuracy (best epoch also given).
"""

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from addernet.checks import json_with, output_file
from addernet.errors import reported
from addernet.tools.bench import child_env, load, run_child

REPO = Path(__file__).resolve().parents[1]
METHODS = ("cnn", "adder", "kd", "pkkd", "pkkd_nokernel", "pkkd_frozen")
HEADER = "Distillation benchmark"  # the first words of results.md


def method_overrides(method, teacher):
    return {
        "cnn": ["model.layer=conv", "adaptive_lr.enabled=false"],
        "adder": [],
        "kd": ["task=kd", f"task.teacher={teacher}"],
        "pkkd": ["task=pkkd"],
        "pkkd_nokernel": ["task=pkkd", "task.kernel=false"],
        "pkkd_frozen": ["task=pkkd", f"task.teacher={teacher}"],
    }[method]


def make_slice(data, out, train_per_class, test_per_class):
    """``out``/{train,test}/<class>/ with symlinks to the first N (sorted) files of each class of ``data``."""
    for split, n in (("train", train_per_class), ("test", test_per_class)):
        for cls in sorted(os.listdir(data / split)):
            folder = out / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for f in sorted(os.listdir(data / split / cls))[:n]:
                if not (folder / f).exists():
                    os.symlink((data / split / cls / f).resolve(), folder / f)
    return out


def common_overrides(args, root):
    return [
        f"model={args.model}",
        "data=cifar10_folder",
        f"data.root={root}",
        f"data.batch_size={args.batch_size}",
        f"data.image_size={args.image_size}",
        f"data.num_workers={args.workers}",
        f"trainer.epochs={args.epochs}",
        f"trainer.seed={args.seed}",
        "trainer.progress=false",
        "trainer.log_every=100",
        *args.extra,
    ]


def train_all(args, root, out, env):
    teacher = out / "runs" / "cnn" / "checkpoints" / "last.pt"
    walls = {}
    for method in args.methods:
        run = out / "runs" / method
        records = read_metrics(run)
        if records and records[-1]["epoch"] == args.epochs:
            print(f"[bench] {method}: finished earlier, skipped", flush=True)
            continue
        cmd = [
            sys.executable,
            "train.py",
            *common_overrides(args, root),
            *method_overrides(method, teacher),
            f"hydra.run.dir={run}",
        ]
        print(f"[bench] {method}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env)
        walls[method] = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"bench_distill: {method} failed with exit code {proc.returncode} (see {run}/train.log)")
    return walls


def read_metrics(run):
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    by_epoch = {r["epoch"]: r for r in map(json.loads, path.read_text().splitlines())}
    return [by_epoch[e] for e in sorted(by_epoch)]


def time_one(args):
    """Child process: build the method's task, time --steps training steps on one synthetic batch; print JSON."""
    import torch
    from hydra import compose, initialize_config_dir

    from addernet.engine import model_from_config
    from addernet.optim import AdaptiveLR, build_optimizer
    from addernet.tasks import build_task

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        overrides = common_overrides(args, args.root) + method_overrides(args.time_one, args.teacher)
        cfg = compose("train", overrides=overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    task = build_task(model_from_config(cfg).to(device), cfg)
    task.to(device)
    optimizer = build_optimizer(cfg.optim, task.param_groups())
    if cfg.adaptive_lr.enabled:
        AdaptiveLR(task.model, float(cfg.adaptive_lr.eta)).attach(optimizer)
    task.train()
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    times, cpu, rss0 = [], [], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for step in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = task(x, y)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    peak = (
        torch.cuda.max_memory_allocated()
        if device.type == "cuda"
        else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    )
    print(json.dumps({"step_s": statistics.median(times), "cpu_s": statistics.median(cpu), "peak_mib": peak / 2**20}))


def time_all(args, root, out, env):
    teacher = out / "runs" / "cnn" / "checkpoints" / "last.pt"
    samples = {m: [] for m in args.methods}
    load_before = load()
    for _ in range(args.rounds):
        for method in args.methods:
            cmd = [
                sys.executable,
                __file__,
                "--time-one",
                method,
                "--root",
                str(root),
                "--teacher",
                str(teacher),
                *sys.argv[1:],
            ]
            samples[method].append(run_child(cmd, f"bench_distill: timing {method}"))
    return samples, load_before, load()


def table(args, out, walls, samples, loads):
    rows, lines = {}, []
    cnn_top1 = None
    for method in args.methods:
        records = read_metrics(out / "runs" / method)
        last = records[-1]
        best = max(records, key=lambda r: r["val_top1"])
        steps = [s["step_s"] for s in samples[method]]
        cpu = [s.get("cpu_s", float("nan")) for s in samples[method]]
        row = {
            "final_top1": last["val_top1"],
            "best_top1": best["val_top1"],
            "best_epoch": best["epoch"],
            "teacher_final_top1": last.get("teacher_val_top1"),
            "val_n": last["val_n"],
            "step_s_median": statistics.median(steps),
            "step_s_min": min(steps),
            "step_s_max": max(steps),
            "cpu_s_median": statistics.median(cpu),
            "cpu_s_min": min(cpu),
            "cpu_s_max": max(cpu),
            "peak_mib": statistics.median(s["peak_mib"] for s in samples[method]),
            "train_minutes": sum(r["epoch_seconds"] for r in records) / 60,
        }
        rows[method] = row
        cnn_top1 = row["final_top1"] if method == "cnn" else cnn_top1
    lines.append(
        f"| run | final top-1 % | best top-1 % (epoch) | teacher final top-1 % | step wall s, median "
        f"[min-max] of {args.rounds} | step CPU s ({args.threads} thread) | peak mem MiB | train min |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for method, r in rows.items():
        teacher = f"{r['teacher_final_top1']:.2f}" if r["teacher_final_top1"] is not None else "-"
        lines.append(
            f"| {method} | {r['final_top1']:.2f} | {r['best_top1']:.2f} ({r['best_epoch']}) | {teacher} | "
            f"{r['step_s_median']:.3f} [{r['step_s_min']:.3f}-{r['step_s_max']:.3f}] | "
            f"{r['cpu_s_median']:.3f} [{r['cpu_s_min']:.3f}-{r['cpu_s_max']:.3f}] | {r['peak_mib']:.0f} | "
            f"{r['train_minutes']:.1f} |"
        )
    lines.append(
        f"\nval n = {next(iter(rows.values()))['val_n']}; load average (1/5/15 min) before timing "
        f"{'/'.join(f'{v:.1f}' for v in loads[0])}, after {'/'.join(f'{v:.1f}' for v in loads[1])}."
    )
    return rows, "\n".join(lines)


def _our_results_md(path):
    with open(path, errors="replace") as f:
        return f.read(len(HEADER)) == HEADER


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "cifar10-jpeg")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "bench_distill")
    p.add_argument("--model", default="resnet20")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--train-per-class", type=int, default=0, help="0: the whole train split")
    p.add_argument("--test-per-class", type=int, default=0, help="0: the whole test split")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (after --warmup)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the timing processes (1: CPU time is robust to machine load)",
    )
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--extra", nargs="*", default=[], help="more train.py overrides for every run")
    p.add_argument("--time-one", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--teacher", help=argparse.SUPPRESS)
    p.add_argument("--overwrite", action="store_true", help="let --out's results files replace files it did not write")
    args = p.parse_args()
    if not args.time_one:
        output_file(args.out / "results.json", "--out", json_with("command", "rows", "samples"), args.overwrite)
        output_file(args.out / "results.md", "--out", _our_results_md, args.overwrite)
    if args.time_one:
        return time_one(args)
    if {"kd", "pkkd_frozen"} & set(args.methods) and "cnn" not in args.methods:
        args.methods = ["cnn", *args.methods]
    args.methods = [m for m in METHODS if m in args.methods]
    if not (args.data / "train").is_dir():
        sys.exit(f"bench_distill: no {args.data}/train; pass --data <folder with train/ and test/ ImageFolders>")
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.data.resolve()
    if args.train_per_class or args.test_per_class:
        root = make_slice(args.data, args.out / "data", args.train_per_class or 10**9, args.test_per_class or 10**9)
    env = child_env()
    started = datetime.datetime.now().isoformat(timespec="minutes")
    walls = train_all(args, root, args.out, env)
    if args.skip_timing:
        nan = {"step_s": float("nan"), "cpu_s": float("nan"), "peak_mib": float("nan")}
        samples, loads = {m: [nan] for m in args.methods}, ((0, 0, 0), (0, 0, 0))
    else:
        samples, *loads = time_all(args, root, args.out, env)
    rows, md = table(args, args.out, walls, samples, loads)
    cmd = "python scripts/bench_distill.py " + " ".join(sys.argv[1:])
    header = (
        f"{HEADER}, started {started}: {args.model}, {args.epochs} epochs, "
        f"batch {args.batch_size}, data {root}\n`{cmd}`\n"
    )
    (args.out / "results.md").write_text(header + "\n" + md + "\n")
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "command": cmd,
                "started": started,
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "rows": rows,
                "samples": samples,
                "load_before": loads[0],
                "load_after": loads[1],
                "wall_s": walls,
            },
            indent=1,
        )
    )
    subprocess.run(
        [
            sys.executable,
            "scripts/plot_curves.py",
            *(str(args.out / "runs" / m) for m in args.methods),
            "--labels",
            *args.methods,
            "--out",
            str(args.out / "curves.png"),
        ],
        cwd=REPO,
        env=env,
        check=False,
    )
    print(header + "\n" + md)


if __name__ == "__main__":
    with reported("bench_distill.py"):
        main()
