"""Results and throughput tables of train.py run dirs, from what the runs recorded.

    python scripts/summarize_runs.py SWEEP_OR_RUN_DIR [...] [--format markdown|csv] [--csv PATH]
                                     [--epochs 400] [--json PATH]

Each argument is a run dir (it holds metrics.jsonl) or a dir of run dirs (a Hydra sweep dir
``multirun/<date>/<time>``, or ``outputs``), searched recursively. Everything comes from files the run
wrote: metrics.jsonl (one record per epoch), config.yaml (the resolved config), run.json (device,
processes, image counts, data placement, compilation, as built) and Hydra's .hydra/overrides.yaml.

Results table, one row per run: overrides, seed, epochs done, final and best val top-1 / top-5, training
images/s (mean over the epochs after the first, which includes warm-up) and wall time (the sum of the
epochs' seconds). Runs whose overrides differ only in trainer.seed get a ``mean ± std`` row (sample std).

Throughput table (scripts/gpu_check.sh stage 4): model.layer, data path (data.on_device), trainer.compile,
the last epoch's train and validation images/s and epoch seconds (the first epoch is warm-up: autotuning,
compilation, cuDNN benchmarking; it is used only when it is the only one), and the projected time of the
full recipe: ``epochs x (50,000 / train img/s + 10,000 / val img/s + overhead)``, CIFAR-10's split sizes at
the measured rates, where overhead is the rest of the measured epoch. The notes column says when the run
recorded that data.on_device did not hold the data on the training device, or that trainer.compile was
set but the model was not compiled.
"""

import argparse
import csv
import io
import json
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

CIFAR_TRAIN, CIFAR_VAL = 50_000, 10_000
RESULT_COLUMNS = (
    "run",
    "overrides",
    "seed",
    "epochs",
    "final_top1",
    "final_top5",
    "best_top1",
    "best_epoch",
    "best_top5",
    "images_per_s",
    "wall_s",
)


def _records(run):
    metrics = run / "metrics.jsonl"
    if not metrics.is_file() or not metrics.read_text().strip():
        raise ValueError(f"{metrics} is missing or empty: the run did not finish an epoch (see {run / 'train.log'}).")
    by_epoch = {}
    for line in metrics.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_epoch[record["epoch"]] = record  # a replayed epoch counts once (its last record)
    return [by_epoch[e] for e in sorted(by_epoch)]


def _facts(run):
    path = run / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _overrides(run):
    """The run's command-line overrides (Hydra's .hydra/overrides.yaml), without hydra.* keys."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [o for o in OmegaConf.to_container(OmegaConf.load(path)) if not o.lstrip("+~").startswith("hydra.")]


def find_runs(paths):
    """Run dirs (holding metrics.jsonl) at or below each path, in order, each once; a path without any is
    kept as it is (reported as not measured)."""
    runs = []
    for p in map(Path, paths):
        found = [p] if (p / "metrics.jsonl").is_file() else sorted(m.parent for m in p.rglob("metrics.jsonl"))
        runs += [r for r in (found or [p]) if r not in runs]
    return runs


def result_row(run_dir):
    """The results row of one run (ValueError naming the file when it left no metrics)."""
    run = Path(run_dir)
    records = _records(run)
    cfg = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    last = records[-1]
    best = max(records, key=lambda r: r["val_top1"])  # the first epoch with the best top-1 (best.pt's)
    timed = records[1:] or records
    return {
        "run": run.name,
        "overrides": " ".join(_overrides(run)),
        "seed": cfg["trainer"]["seed"],
        "epochs": len(records),
        "final_top1": last["val_top1"],
        "final_top5": last["val_top5"],
        "best_top1": best["val_top1"],
        "best_epoch": best["epoch"],
        "best_top5": max(r["val_top5"] for r in records),
        "images_per_s": statistics.fmean(r["images_per_s"] for r in timed),
        "wall_s": sum(r["epoch_seconds"] for r in records),
    }


def seed_groups(rows):
    """``mean ± std`` rows for the runs whose overrides differ only in trainer.seed (2 runs or more)."""
    groups = {}
    for r in rows:
        key = " ".join(o for o in r["overrides"].split() if not o.lstrip("+").startswith("trainer.seed="))
        groups.setdefault(key, []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) < 2 or len({m["seed"] for m in members}) < 2:
            continue
        row = {
            "run": f"mean ± std ({len(members)} seeds)",
            "overrides": key,
            "seed": ",".join(str(m["seed"]) for m in members),
            "epochs": min(m["epochs"] for m in members),
        }
        for k in ("final_top1", "final_top5", "best_top1", "best_top5", "images_per_s", "wall_s"):
            values = [m[k] for m in members]
            row[k] = (statistics.fmean(values), statistics.stdev(values))
        out.append(row)
    return out


def _cell(value, digits=2):
    if isinstance(value, tuple):
        return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "" if value is None else str(value)


def results_markdown(rows):
    head = (
        "| run | overrides | seed | epochs | final top-1 | final top-5 | best top-1 (epoch) | best top-5 | img/s "
        "| wall s |"
    )
    lines = [head, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        best = _cell(r["best_top1"]) + (f" ({r['best_epoch']})" if r.get("best_epoch") else "")
        lines.append(
            f"| {r['run']} | {r['overrides'] or '(none)'} | {r['seed']} | {r['epochs']} | "
            f"{_cell(r['final_top1'])} | {_cell(r['final_top5'])} | {best} | {_cell(r['best_top5'])} | "
            f"{_cell(r['images_per_s'], 0)} | {_cell(r['wall_s'], 1)} |"
        )
    return "\n".join(lines)


def results_csv(rows):
    """CSV of the rows; a mean ± std cell is written as two columns' worth: ``<key>`` and ``<key>_std``."""
    columns = [
        c
        for k in RESULT_COLUMNS
        for c in ((k, f"{k}_std") if k not in ("run", "overrides", "seed", "epochs", "best_epoch") else (k,))
    ]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        flat = {}
        for k in RESULT_COLUMNS:
            v = r.get(k)
            if isinstance(v, tuple):
                flat[k], flat[f"{k}_std"] = v
            else:
                flat[k] = v
        writer.writerow(flat)
    return buf.getvalue()


def summarize(run_dir, epochs=400):
    """One throughput row (dict) for ``run_dir``; raises ValueError naming the file when the run left no metrics."""
    run = Path(run_dir)
    records = _records(run)
    cfg = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    facts = _facts(run)
    last = records[-1]
    n_train, n_val = facts.get("train_images"), facts.get("val_images")
    ips, vips = last["images_per_s"], last["val_images_per_s"]
    overhead = max(last["epoch_seconds"] - n_train / ips - n_val / vips, 0.0) if n_train and n_val else 0.0
    on_device, compiled = bool(cfg["data"].get("on_device", False)), bool(cfg["trainer"].get("compile", False))
    device, held = facts.get("device"), facts.get("data_held_on")
    notes = []
    if len(records) == 1:
        notes.append("one epoch only: includes warm-up")
    if on_device and device and held and held != device:
        notes.append(f"data held on {held}, not {device} (build_loader got no device)")
    if compiled and not facts.get("compiled"):
        notes.append("not compiled (the model was not compiled)")
    return {
        "run": run.name,
        "model": f"{cfg['model']['name']} {cfg['model']['layer']}",
        "data": "device" if on_device else "DataLoader",
        "compile": compiled,
        "device": device or "?",
        "epochs_run": len(records),
        "train_img_s": ips,
        "val_img_s": vips,
        "epoch_s": last["epoch_seconds"],
        "overhead_s": overhead,
        "projected_h": epochs * (CIFAR_TRAIN / ips + CIFAR_VAL / vips + overhead) / 3600,
        "notes": notes,
    }


def table(rows, epochs):
    head = (
        f"| model | data | compile | device | train img/s | val img/s | epoch s (last) | "
        f"projected {epochs} epochs | notes |"
    )
    lines = [head, "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['data']} | {'on' if r['compile'] else 'off'} | {r['device']} | "
            f"{r['train_img_s']:.0f} | {r['val_img_s']:.0f} | {r['epoch_s']:.2f} | "
            f"{r['projected_h']:.2f} h | {'; '.join(r['notes'])} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run dirs (hydra.run.dir) or dirs holding them (a sweep dir)")
    ap.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="results table format")
    ap.add_argument("--csv", help="also write the results table as CSV to this file")
    ap.add_argument("--epochs", type=int, default=400, help="epochs of the recipe to project (paper: 400)")
    ap.add_argument("--json", help="also write the throughput rows to this file")
    a = ap.parse_args(argv)
    results, rows, missing = [], [], []
    for run in find_runs(a.runs):
        try:
            rows.append(summarize(run, a.epochs))
            results.append(result_row(run))
        except (ValueError, OSError, KeyError) as e:
            missing.append(f"{run}: {e}")
    results += seed_groups(results)
    if results:
        print(results_markdown(results) if a.format == "markdown" else results_csv(results), end="\n")
        if a.format == "markdown":
            print()
            print(table(rows, a.epochs))
    for line in missing:
        print(f"not measured: {line}")
    if a.csv and results:
        Path(a.csv).write_text(results_csv(results))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
