"""Accuracy table of post-training quantisation (docs/quantization.md) for one float checkpoint.

    python scripts/quant_accuracy.py CHECKPOINT --val DIR [--val DIR2] [--train DIR] [--calib-images N]
        [--settings 8:4:1,4:4:0,...] [--json PATH]

Each setting is bits:groups:bn_recalib ("float" rows are added: as loaded, and with BatchNorm
re-estimated). The activation ranges are computed once (they do not depend on bits or groups), then
every setting quantises a fresh copy with quantize_model and evaluates with addernet.engine.evaluation.evaluate
on each --val folder (ImageFolder, CIFAR-10 transforms). Official ResNet-20 files or our checkpoints.
"""

import argparse
import copy
import datetime
import json
import os
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from addernet.data import build_loader
from addernet.engine import evaluate
from addernet.engine.evaluation import load_float_model
from addernet.errors import reported
from addernet.quant import calibration_loader, quantize_model
from addernet.quant import convert as qconvert
from addernet.quant.calibration import recalibrate_bn

REPO = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--val", action="append", required=True)
    p.add_argument("--train", default=str(REPO.parent / "shared" / "cifar10-jpeg" / "train"))
    p.add_argument("--calib-images", type=int, default=25600)
    p.add_argument("--settings", default="8:4:1,6:4:1,5:4:1,4:4:1,8:1:1,4:1:1,8:4:0,4:4:0")
    p.add_argument("--json")
    a = p.parse_args()
    overrides = [
        f"checkpoint={a.checkpoint}",
        "model=resnet20",
        "data=cifar10_folder",
        f"data.train_dir={a.train}",
        "data.num_workers=0",
        "data.batch_size=250",
        f"quant.calib_images={a.calib_images}",
        "quant.bits=8",
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("test", overrides=overrides)
    base, cfg, _ = load_float_model(cfg, overrides, entry="test")
    loaders = {}
    for v in a.val:
        c = copy.deepcopy(cfg)
        c.data.val_dir = v
        loaders[v] = build_loader(c.data, "val")
    calib = calibration_loader(cfg)
    bn_loader = calibration_loader(cfg, augment=bool(cfg.quant.bn_augment))
    ranges = qconvert.activation_ranges(base, calib, float(cfg.quant.act_quantile), float(cfg.quant.act_range_floor))
    cached = qconvert.activation_ranges
    qconvert.activation_ranges = lambda *args, **kw: ranges  # same images, same float model: reuse
    rows = []

    def record(name, model):
        row = {"setting": name, "load_before": os.getloadavg()[0]}
        for v, loader in loaders.items():
            row[v] = evaluate(model, loader, "cpu")["top1"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    record("float", base)
    torch.manual_seed(int(cfg.quant.seed))
    record("float + BN re-estimated", recalibrate_bn(copy.deepcopy(base), bn_loader))
    for s in a.settings.split(","):
        bits, groups, bn = (int(x) for x in s.split(":"))
        q = copy.deepcopy(cfg.quant)
        q.bits, q.groups, q.bn_recalib = bits, groups, bool(bn)
        torch.manual_seed(int(q.seed))
        record(
            f"{bits} bits, G={groups}, BN {'re-estimated' if bn else 'as loaded'}",
            quantize_model(copy.deepcopy(base), calib, q, bn_loader),
        )
    qconvert.activation_ranges = cached
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "args": vars(a),
                    "calib_images": len(calib.dataset),
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    with reported("quant_accuracy.py"):
        main()
