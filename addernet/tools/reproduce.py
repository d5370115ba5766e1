"""The paper's CIFAR-10 ResNet-20 row from the official checkpoint: float, 8/6/5/4 bits and ONNX, with intervals.

    python -m addernet.tools.reproduce cifar10 [--checkpoint PATH] [--data-root DIR] [--bits 8,6,5,4]
        [--no-onnx] [--out DIR] [OVERRIDE ...]
    scripts/reproduce.sh cifar10 [the same arguments]

``--data-root DIR``: a folder with ``train/`` and ``test/`` ImageFolder trees of CIFAR-10 images
(``data=cifar10_folder``, e.g. ``../shared/cifar10-lossless-head``), or else torchvision's CIFAR-10 folder
(``data=cifar10``: downloaded into it when absent; default ``data``). OVERRIDEs (``key=value``) go to every
setting, as on test.py's command line (e.g. ``quant.calib_images=5085 data.num_workers=2``).

Every setting runs as ``test.py`` runs it (addernet.engine.evaluation): the float model; ``quant.bits=b`` for each
bit width (calibrated on the training split, then evaluated); ONNX: the float model exported with standard
operators (addernet/quant/onnx.py) and evaluated by onnxruntime on the same test images. Prints a Markdown table
(top-1 with its 95% Wilson interval and counts, top-5, the drop from the float model next to AdderQuant's
published drop, the seconds each setting took and the load average) and writes it to OUT/results.md, with
OUT/results.csv holding one row per setting (checkpoint sha256, data, n, top-1, top-5, interval, bits, date,
CPU, seconds, load), as timm's results CSVs. OUT defaults to outputs/reproduce_cifar10.
"""

import argparse
import csv
import datetime
import hashlib
import os
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..analysis.interval import accuracy_interval, correct_count
from ..config import config_dir
from ..config.validate import one_line
from ..data import build_loader
from ..engine import ConfigError
from ..engine.evaluation import evaluate_checkpoint, load_float_model, with_intervals
from ..engine.outputs import setup_logging
from ..errors import reported
from .bench import cpu_model, load

PAPER_TOP1 = 91.84  # Chen et al., CVPR 2020, Table 3: AdderNet ResNet-20, CIFAR-10 (10,000 test images)
# AdderQuant (Nie et al., NeurIPS 2022), ResNet-20 CIFAR-10 post-training quantisation, from the paper's 91.84
ADDERQUANT_TOP1 = {8: 91.36, 6: 91.21, 5: 90.86, 4: 90.27}
DEFAULT_CHECKPOINT = "../shared/official/ResNet20-AdderNet.pth"
ONNX_BATCH = 16  # images per onnxruntime call: bounds its memory (evaluate_onnx)
COLUMNS = (
    "setting",
    "bits",
    "data",
    "n",
    "top1",
    "top1_correct",
    "top1_ci95_low",
    "top1_ci95_high",
    "top5",
    "drop",
    "adderquant_drop",
    "seconds",
    "load_before",
    "checkpoint_sha256",
    "date",
    "cpu",
)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_overrides(root):
    """data=cifar10_folder for a folder holding train/ and test/, else torchvision's data=cifar10 in ``root``."""
    if os.path.isdir(os.path.join(root, "train")) and os.path.isdir(os.path.join(root, "test")):
        return ["data=cifar10_folder", f"data.root={root}"]
    return ["data=cifar10", f"data.root={root}"]


def compose_test(overrides):
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return compose(config_name="test", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from None


def evaluate_setting(overrides):
    """test.py's result dict (counts and intervals included) for ``overrides``."""
    return with_intervals(evaluate_checkpoint(compose_test(overrides), overrides))


def evaluate_onnx(overrides, path):
    """{"top1", "top5", "n"} of the float model exported to ONNX at ``path``, run by onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError(
            "the ONNX row needs onnx and onnxruntime (pip install -r requirements-extras.txt); or pass --no-onnx"
        ) from None
    from ..quant.onnx import export_onnx

    cfg = compose_test(overrides)
    model, cfg, _ = load_float_model(cfg, overrides, entry="test")
    size = int(cfg.data.image_size)
    export_onnx(model.eval(), path, torch.zeros(2, int(cfg.data.in_channels), size, size))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    data_cfg = OmegaConf.merge(cfg.data, {"pin_memory": False})
    correct1 = correct5 = n = 0
    for images, target in build_loader(data_cfg, "val"):
        # onnxruntime materialises each adder layer's N x O x K x L difference tensor, in float32 and again in
        # float64 for the sum (ResNet-20's first stage: 16 x 144 x 1024 per image, 28 MB), so the loader's
        # batch goes through in slices of ONNX_BATCH images
        chunks = torch.split(images, ONNX_BATCH)
        logits = torch.cat([torch.from_numpy(session.run(None, {"images": c.numpy()})[0]) for c in chunks])
        top5 = logits.topk(min(5, logits.shape[1]), 1).indices
        correct1 += int((top5[:, 0] == target).sum())
        correct5 += int((top5 == target[:, None]).any(1).sum())
        n += len(target)
    return with_intervals({"top1": 100.0 * correct1 / n, "top5": 100.0 * correct5 / n, "n": n})


def markdown(rows):
    lines = [
        "| setting | n | top-1 % [95% interval] (correct) | top-5 % | drop from float | AdderQuant's drop | s | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        top1 = f"{r['top1']:.2f} [{r['top1_ci95_low']:.2f}, {r['top1_ci95_high']:.2f}] ({r['top1_correct']}/{r['n']})"
        drop = "" if r["drop"] == "" else f"{r['drop']:+.2f}"
        aq = "" if r["adderquant_drop"] == "" else f"{r['adderquant_drop']:+.2f}"
        lines.append(
            f"| {r['setting']} | {r['n']} | {top1} | {r['top5']:.2f} | {drop} | {aq} | {r['seconds']:.1f} | "
            f"{r['load_before']:.2f} |"
        )
    return "\n".join(lines)


def run(args, extra):
    checkpoint = args.checkpoint
    if not os.path.isfile(checkpoint):
        raise ConfigError(
            f"--checkpoint {checkpoint} is not a file; fetch the official ResNet-20 with "
            "python -m addernet.zoo fetch resnet20-official --dest DIR and pass --checkpoint DIR/ResNet20-AdderNet.pth"
        )
    try:
        bits = [int(b) for b in args.bits.split(",") if b]
    except ValueError:
        raise ConfigError(f"--bits {args.bits!r}: give bit widths separated by commas, e.g. --bits 8,6,5,4") from None
    base = [f"checkpoint={checkpoint}", "model=resnet20", *data_overrides(args.data_root), *extra]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = [("float", None, base)]
    settings += [(f"{b} bits", b, [*base, f"quant.bits={b}"]) for b in bits]
    if not args.no_onnx:
        settings.append(("ONNX (float, onnxruntime)", None, base))
    meta = {"checkpoint_sha256": sha256(checkpoint), "date": datetime.date.today().isoformat(), "cpu": cpu_model()[0]}
    data = " ".join(o for o in base if o.startswith("data"))
    rows, float_top1 = [], None
    for name, b, overrides in settings:
        print(f"reproduce: {name} ...", file=sys.stderr, flush=True)
        before, start = load()[0], time.perf_counter()
        if name.startswith("ONNX"):
            result = evaluate_onnx(overrides, out / "resnet20.onnx")
        else:
            result = evaluate_setting(overrides)
        seconds = time.perf_counter() - start
        if b is None and float_top1 is None:
            float_top1 = result["top1"]
        low, high = accuracy_interval(result["top1"], result["n"])
        row = {
            "setting": name,
            "bits": "" if b is None else b,
            "data": data,
            "n": result["n"],
            "top1": result["top1"],
            "top1_correct": correct_count(result["top1"], result["n"]),
            "top1_ci95_low": low,
            "top1_ci95_high": high,
            "top5": result["top5"],
            "drop": "" if name == "float" else result["top1"] - float_top1,
            "adderquant_drop": "" if b is None else ADDERQUANT_TOP1[b] - PAPER_TOP1 if b in ADDERQUANT_TOP1 else "",
            "seconds": seconds,
            "load_before": before,
            **meta,
        }
        rows.append(row)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows)
    header = (
        f"Official ResNet-20 (sha256 {meta['checkpoint_sha256'][:12]}...), {data}; paper: {PAPER_TOP1} on 10,000 "
        f"images. {meta['date']}, {meta['cpu']}, {os.cpu_count()} CPUs, load average before each setting in the "
        "last column (5 or more: not a publishable time)."
    )
    (out / "results.md").write_text(header + "\n\n" + table + "\n")
    print(header + "\n\n" + table, flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="reproduce", description=__doc__.splitlines()[0])
    p.add_argument("dataset", choices=["cifar10"], help="the paper's row to reproduce (CIFAR-10 ResNet-20)")
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help=f"the official file (default {DEFAULT_CHECKPOINT})")
    p.add_argument("--data-root", default="data", help="CIFAR-10: a train/ + test/ image folder or torchvision's root")
    p.add_argument("--bits", default="8,6,5,4", help="bit widths, comma-separated (default 8,6,5,4)")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX row (needs onnx and onnxruntime)")
    p.add_argument("--out", default="outputs/reproduce_cifar10", help="folder of results.csv and results.md")
    args, extra = p.parse_known_args(argv)
    unknown = [e for e in extra if "=" not in e or e.startswith("-")]
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)} (overrides are key=value)")
    restore_logging = setup_logging(None, True)  # the calibration's stage lines, labelled [addernet.quant]
    try:
        with reported("reproduce", errors=(OmegaConfBaseException, ImportError)):
            run(args, extra)
    finally:
        restore_logging()


if __name__ == "__main__":
    main()
