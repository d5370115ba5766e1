"""Results and throughput tables of train.py run dirs, from what the runs recorded.

    python -m addernet.analysis.summarize SWEEP_OR_RUN_DIR [...] [--format markdown|csv] [--csv PATH]
                                          [--epochs N] [--images TRAIN VAL] [--json PATH] [--overwrite]

(``scripts/summarize_runs.py`` is the same command.) Each argument is a run dir (it holds metrics.jsonl)
or a dir of run dirs (a Hydra sweep dir ``multirun/<date>/<time>``, or ``outputs``), searched
recursively. Everything comes from files the run wrote: metrics.jsonl (one record per epoch),
config.yaml (the resolved config), run.json (device, processes, image counts, data placement,
compilation, as built), Hydra's .hydra/overrides.yaml, and error.txt for a sweep job that failed.

Results table, one row per run: status (``ok`` or ``failed (exit N)``), overrides, seed, epochs done,
final and best val top-1 / top-5, training images/s (mean over the epochs after the first, which
includes warm-up) and wall time (the sum of the epochs' seconds). Runs whose overrides differ only in
trainer.seed get a ``mean ± std (k of n seeds)`` row over the k that finished (sample std; a failed
seed is counted in n, never averaged).

Throughput table, one row per finished run: the last epoch's train and validation images/s and
epoch seconds (the first epoch is warm-up; it is used only when it is the only one), and the
projected time of ``--epochs`` epochs (default: the run's own trainer.epochs) at the measured rates:
``epochs x (train images / train img/s + val images / val img/s + overhead)``, where the image counts
are the run's own (run.json) unless ``--images TRAIN VAL`` names others (CIFAR-10's full recipe:
``--epochs 400 --images 50000 10000``) and overhead is the rest of the measured epoch. The cell says
what it assumed.

``--csv`` and ``--json`` replace only a file this command wrote (a results CSV, throughput rows); any other
existing file needs ``--overwrite``. A run whose files are damaged (a metrics.jsonl line that is not a train.py
record, a config.yaml that is not YAML) is one ``not measured`` line naming the file; the other runs are still
summarised.
"""

import argparse
import csv
import io
import json
import statistics
import sys
from pathlib import Path

from ..checks import json_with, output_file
from ..errors import reported
from .runs import config, facts, failure, find_runs, load_metrics, overrides

RESULT_COLUMNS = (
    "run",
    "status",
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
AVERAGED = ("final_top1", "final_top5", "best_top1", "best_top5", "images_per_s", "wall_s")


def _values(records, key):
    return [r[key] for r in records if r.get(key) is not None]


def result_row(run_dir):
    """The results row of one run; a failed sweep job's row has status ``failed (exit N)`` and what it
    measured before failing. ValueError naming the file when a finished run left no metrics."""
    run = Path(run_dir)
    failed = failure(run)
    try:
        records = load_metrics(run)
    except (OSError, ValueError):
        if failed is None:
            raise
        records = []
    cfg = config(run)
    scored = [r for r in records if r.get("val_top1") is not None]
    best = max(scored, key=lambda r: r["val_top1"]) if scored else {}  # the first epoch with the best top-1
    timed = records[1:] or records
    ips = _values(timed, "images_per_s")
    return {
        "run": run.name,
        "status": "ok" if failed is None else f"failed (exit {failed[0]})",
        "error": None if failed is None else failed[1],
        "overrides": " ".join(overrides(run)),
        "seed": cfg.get("trainer", {}).get("seed"),
        "epochs": len(records),
        "final_top1": records[-1].get("val_top1") if records else None,
        "final_top5": records[-1].get("val_top5") if records else None,
        "best_top1": best.get("val_top1"),
        "best_epoch": best.get("epoch"),
        "best_top5": max(_values(records, "val_top5"), default=None),
        "images_per_s": statistics.fmean(ips) if ips else None,
        "wall_s": sum(_values(records, "epoch_seconds")) if records else None,
    }


def _seed_of(override):
    return override.lstrip("+").startswith("trainer.seed=")


def seed_groups(rows):
    """``mean ± std (k of n seeds)`` rows for the runs whose overrides differ only in trainer.seed (2 runs or
    more): the mean over the k that finished; the failed ones count in n only."""
    groups = {}
    for r in rows:
        key = " ".join(o for o in r["overrides"].split() if not _seed_of(o))
        groups.setdefault(key, []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) < 2 or len({m["seed"] for m in members}) < 2:
            continue
        done = [m for m in members if m["status"] == "ok"]
        row = {
            "run": f"mean ± std ({len(done)} of {len(members)} seeds)",
            "status": "ok" if len(done) == len(members) else f"{len(members) - len(done)} failed",
            "overrides": key,
            "seed": ",".join(str(m["seed"]) for m in done),
            "epochs": min((m["epochs"] for m in done), default=0),
        }
        for k in AVERAGED:
            values = [m[k] for m in done if m[k] is not None]
            row[k] = (statistics.fmean(values), statistics.stdev(values)) if len(values) > 1 else (values or [None])[0]
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
        "| run | status | overrides | seed | epochs | final top-1 | final top-5 | best top-1 (epoch) | best top-5 "
        "| img/s | wall s |"
    )
    lines = [head, "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        best = _cell(r["best_top1"]) + (f" ({r['best_epoch']})" if r.get("best_epoch") else "")
        lines.append(
            f"| {r['run']} | {r['status']} | {r['overrides'] or '(none)'} | {_cell(r['seed'])} | {r['epochs']} | "
            f"{_cell(r['final_top1'])} | {_cell(r['final_top5'])} | {best} | {_cell(r['best_top5'])} | "
            f"{_cell(r['images_per_s'], 0)} | {_cell(r['wall_s'], 1)} |"
        )
    return "\n".join(lines)


# the CSV's columns: a mean ± std cell is written as two columns' worth, ``<key>`` and ``<key>_std``
CSV_COLUMNS = [c for k in RESULT_COLUMNS for c in ((k, f"{k}_std") if k in AVERAGED else (k,))]


def _our_csv(path):
    """Whether ``path`` is a results CSV this command wrote (its header row)."""
    with open(path, newline="", errors="replace") as f:
        return next(csv.reader(f), None) == CSV_COLUMNS


def results_csv(rows):
    """CSV of the rows (CSV_COLUMNS)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
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


def summarize(run_dir, epochs=None, images=None):
    """One throughput row (dict) for ``run_dir``: ``epochs`` (default: the run's trainer.epochs) projected at
    ``images`` ((train, val); default: the run's own counts from run.json). ValueError naming the file when
    the run left no metrics."""
    run = Path(run_dir)
    records = load_metrics(run)
    cfg, measured = config(run), facts(run)
    last = records[-1]
    own = (measured.get("train_images"), measured.get("val_images"))
    ips, vips, seconds = last.get("images_per_s"), last.get("val_images_per_s"), last.get("epoch_seconds")
    epochs = epochs or cfg.get("trainer", {}).get("epochs")
    trainer, data = cfg.get("trainer", {}), cfg.get("data", {})
    on_device, compiled = bool(data.get("on_device", False)), bool(trainer.get("compile", False))
    device, held = measured.get("device"), measured.get("data_held_on")
    notes, projected, assumed, overhead = [], None, None, None
    if len(records) == 1:
        notes.append("one epoch only: includes warm-up")
    if on_device and device and held and held != device:
        notes.append(f"data held on {held}, not {device} (build_loader got no device)")
    if compiled and not measured.get("compiled"):
        notes.append("not compiled (the model was not compiled)")
    if all(own) and ips and vips and seconds is not None and epochs:
        overhead = max(seconds - own[0] / ips - own[1] / vips, 0.0)
        n_train, n_val = images or own
        projected = epochs * (n_train / ips + n_val / vips + overhead) / 3600
        assumed = f"{epochs} epochs x {n_train}+{n_val} images ({'--images' if images else 'its data'})"
    else:
        notes.append("not projected: run.json has no image counts or the epoch no rates")
    return {
        "run": run.name,
        "model": f"{cfg.get('model', {}).get('name')} {cfg.get('model', {}).get('layer')}",
        "data": "device" if on_device else "DataLoader",
        "compile": compiled,
        "cuda_graph": bool(trainer.get("cuda_graph", False)),
        "device": device or "?",
        "epochs_run": len(records),
        "train_img_s": ips,
        "val_img_s": vips,
        "epoch_s": seconds,
        "overhead_s": overhead,
        "projected_h": projected,
        "projection": assumed,
        "notes": notes,
    }


def _speedup(row):
    """The throughput table's speed-up cell: trainer.compile, trainer.cuda_graph or neither."""
    return "compile" if row["compile"] else "cuda graph" if row.get("cuda_graph") else "off"


def table(rows):
    head = "| run | model | data | speed-up | device | train img/s | val img/s | epoch s (last) | projected | notes |"
    lines = [head, "| --- | --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        projected = "" if r["projected_h"] is None else f"{r['projected_h']:.2f} h ({r['projection']})"
        lines.append(
            f"| {r['run']} | {r['model']} | {r['data']} | {_speedup(r)} | {r['device']} | "
            f"{_cell(r['train_img_s'], 0)} | {_cell(r['val_img_s'], 0)} | {_cell(r['epoch_s'])} | "
            f"{projected} | {'; '.join(r['notes'])} |"
        )
    return "\n".join(lines)


def _positive(text):
    """An argparse type: a whole number >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def main(argv=None):
    """Print the tables; 0 when every run finished and was measured, else 1 (failed jobs are rows, too)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run dirs (hydra.run.dir) or dirs holding them (a sweep dir)")
    ap.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="results table format")
    ap.add_argument("--csv", help="also write the results table as CSV to this file")
    ap.add_argument("--epochs", type=_positive, help="epochs to project (default: each run's trainer.epochs)")
    ap.add_argument(
        "--images",
        type=_positive,
        nargs=2,
        metavar=("TRAIN", "VAL"),
        help="image counts to project (default: the run's)",
    )
    ap.add_argument("--json", help="also write the throughput rows to this file")
    ap.add_argument(
        "--overwrite", action="store_true", help="let --csv / --json replace a file this command did not write"
    )
    a = ap.parse_args(argv)
    with reported(ap.prog):  # before any run is read
        for path, option, ours in ((a.csv, "--csv", _our_csv), (a.json, "--json", json_with("run", "projected_h"))):
            if path:
                output_file(path, option, ours, a.overwrite)
    results, rows, missing = [], [], []
    for run in find_runs(a.runs):
        try:
            results.append(result_row(run))
            if results[-1]["status"] == "ok":
                rows.append(summarize(run, a.epochs, a.images))
        except (ValueError, OSError, KeyError) as e:
            missing.append(f"{run}: {e}")
    failed = [r for r in results if r["status"] != "ok"]
    results += seed_groups(results)
    if results:
        print(results_markdown(results) if a.format == "markdown" else results_csv(results), end="\n")
        if a.format == "markdown" and rows:
            print()
            print(table(rows))
    for r in failed:
        print(f"failed: {r['run']}: {r['error']}")
    for line in missing:
        print(f"not measured: {line}")
    if a.csv and results:
        Path(a.csv).write_text(results_csv(results))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows and not missing and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
