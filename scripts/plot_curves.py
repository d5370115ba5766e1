"""Plot train/val top-1 and loss per epoch for one or more runs (e.g. AdderNet vs its CNN twin).

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] [--out curves.png] [--labels adder cnn]

Each RUN_DIR holds the `metrics.jsonl` that train.py writes (one JSON object per epoch). The runs are
overlaid on shared axes (one colour per run; train dashed, val solid), so adder and CNN compare
directly. matplotlib is an optional dependency of this script only: `pip install -e '.[plot]'`.
"""

import argparse
import json
from pathlib import Path

from addernet.errors import ConfigError, DataError, reported

# (panel title, y label, train key, val key) for the two panels.
PANELS = (
    ("top-1 accuracy", "top-1 (%)", "train_top1", "val_top1"),
    ("loss", "cross-entropy loss", "train_loss", "val_loss"),
)


def load_metrics(run_dir):
    """Per-epoch records of a run, in file order, keeping only lines that carry an `epoch`.

    A run resumed from a checkpoint may repeat an epoch; the last record of an epoch wins.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a run directory written by train.py")
    by_epoch = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON ({e})") from None
        if isinstance(rec, dict) and "epoch" in rec:
            by_epoch[rec["epoch"]] = rec
    if not by_epoch:
        raise ValueError(f"{path} has no per-epoch records (no line with an 'epoch' field)")
    return [by_epoch[e] for e in sorted(by_epoch)]


def series(records, key):
    """(epochs, values) for the records that have `key`; epochs as stored (train.py counts from 1)."""
    pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(runs, out):
    """Draw `runs` ([(label, records)]) into a two-panel figure saved at `out`; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, ylabel, train_key, val_key) in zip(axes, PANELS):
        for i, (label, records) in enumerate(runs):
            c = colors[i % len(colors)]
            for key, style, split in ((train_key, "--", "train"), (val_key, "-", "val")):
                x, y = series(records, key)
                if x:  # markers: a one-epoch run is a single point, which a line alone would not show
                    ax.plot(x, y, style, color=c, marker="o", markersize=3, label=f"{label} {split}")
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole epochs, even for one
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="directories holding metrics.jsonl")
    p.add_argument("--out", default="curves.png", help="output PNG (default: curves.png)")
    p.add_argument("--labels", nargs="+", help="one legend label per run (default: the directory name)")
    args = p.parse_args(argv)
    if args.labels and len(args.labels) != len(args.run_dirs):
        p.error(f"--labels has {len(args.labels)} names for {len(args.run_dirs)} runs")
    labels = args.labels or [Path(d).resolve().name for d in args.run_dirs]
    try:
        runs = [(label, load_metrics(d)) for label, d in zip(labels, args.run_dirs)]
    except (OSError, ValueError) as e:
        raise DataError(str(e)) from None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "plot_curves.py needs matplotlib, an optional extra: pip install -e '.[plot]' (or pip install matplotlib)"
        ) from None
    plot(runs, args.out)
    print(f"wrote {args.out} ({len(runs)} run(s))")


if __name__ == "__main__":
    with reported("plot_curves.py"):
        main()
