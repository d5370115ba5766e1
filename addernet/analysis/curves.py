"""Plot train/val top-1 and loss per epoch for one or more runs (e.g. AdderNet vs its CNN twin).

    python -m addernet.analysis.curves RUN_DIR [RUN_DIR ...] [--out curves.png] [--labels adder cnn] [--log]

(``scripts/plot_curves.py`` is the same command.) Each RUN_DIR holds the ``metrics.jsonl`` that
train.py writes (one JSON object per epoch). The runs are overlaid on shared axes (one colour per run;
train dashed, val solid), so adder and CNN compare directly; the figure's title names the runs.
``--log`` draws the loss on a log scale, so one early spike (a CNN's first val loss of 89) does not
flatten every other line. matplotlib is an optional dependency: ``pip install -e '.[plot]'``.

``--out`` is a PNG, PDF, SVG, EPS or PS file (a name without an extension gets ``.png``); the figure records that
this command made it, so the next run replaces it, while any other existing file needs ``--overwrite``. A missing
folder is created.
"""

import argparse
import os
from pathlib import Path

from ..checks import output_file
from ..errors import ConfigError, DataError, reported
from .runs import load_metrics

# the formats whose files record their maker (FORMATS' metadata), so a later run knows it may replace them
FORMATS = ("png", "pdf", "svg", "eps", "ps")
MAKER = "addernet plot_curves"

# (panel title, y label, train key, val key) for the two panels.
PANELS = (
    ("top-1 accuracy", "top-1 (%)", "train_top1", "val_top1"),
    ("loss", "cross-entropy loss", "train_loss", "val_loss"),
)


def series(records, key):
    """(epochs, values) for the records that have `key`; epochs as stored (train.py counts from 1)."""
    pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(runs, out, log=False):
    """Draw `runs` ([(label, records)]) into a two-panel figure saved at `out` (the loss on a log scale when
    `log`); returns the figure."""
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
        if log and title == "loss":
            ax.set_yscale("log")
            title += " (log scale)"
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole epochs, even for one
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(" vs ".join(label for label, _ in runs))
    fig.tight_layout()
    fig.savefig(out, dpi=120, metadata={"Creator": MAKER})
    return fig


def _ours(path, span=1 << 16):
    """Whether ``path`` is a figure this command made: its Creator metadata, which each of FORMATS keeps near the
    start of the file (PNG, SVG, EPS, PS) or near its end (PDF)."""
    with open(path, "rb") as f:
        head = f.read(span)
        f.seek(max(f.seek(0, os.SEEK_END) - span, 0))
        return MAKER.encode() in head + f.read()


def output(out, overwrite=False):
    """The file ``--out`` names (``.png`` added to a name without an extension), checked before anything is drawn:
    ConfigError for a format other than FORMATS or a file this command would replace without having made it."""
    out = Path(out)
    if not out.suffix:
        out = out.with_name(out.name + ".png")
    if out.suffix[1:].lower() not in FORMATS:
        raise ConfigError(
            f"--out {out}: {out.suffix} is not a format plot_curves.py writes; use .{', .'.join(FORMATS)}."
        )
    return output_file(out, "--out", _ours, overwrite)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="directories holding metrics.jsonl")
    p.add_argument("--out", default="curves.png", help=f"output figure: {', '.join(FORMATS)} (default: curves.png)")
    p.add_argument("--labels", nargs="+", help="one legend label per run (default: the directory name)")
    p.add_argument("--log", action="store_true", help="loss on a log scale (early spikes stay readable)")
    p.add_argument("--overwrite", action="store_true", help="let --out replace a file this command did not make")
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
            "plotting needs matplotlib, an optional extra: pip install -e '.[plot]' (or pip install matplotlib)"
        ) from None
    out = output(args.out, args.overwrite)
    import matplotlib.pyplot as plt

    plt.close(plot(runs, out, log=args.log))
    print(f"wrote {out} ({len(runs)} run(s))")


if __name__ == "__main__":
    with reported("plot_curves.py"):
        main()
