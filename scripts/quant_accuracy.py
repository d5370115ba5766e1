"""Accuracy table of post-training quantisation (docs/quantization.md) for one float checkpoint: settings x bits.

    python scripts/quant_accuracy.py CHECKPOINT --train DIR --val DIR [--val DIR2] [--calib-images N]
        [--bits 8,6,5,4] [--setting "NAME: quant.key=value ..."] ... [--json PATH] [--markdown PATH]

Each --setting is a name and the quant.* overrides it sets on top of configs/quant/default.yaml (default: the
AdderQuant code's method, and this repository's defaults); every setting is run at every bit width of --bits.
A row calibrates a fresh copy of the model exactly as test.py does (quantize_for_eval: the training images of
--train, seeded subset of --calib-images), then evaluates it with the integer network on each --val folder
(ImageFolder trees, CIFAR-10 transforms). Per row: top-1 with its count and 95% Wilson interval on every --val,
the drop from the float model on the same images, AdderQuant's published drop at that width, and the seconds
of calibration + evaluation on the first --val, with the load average before and after (a figure taken at a
load of 5 or more is marked: not publishable). The official ResNet-20 files and our checkpoints both work.
"""

import argparse
import copy
import json
import os
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from addernet.analysis.interval import format_accuracy
from addernet.data import build_loader
from addernet.engine import evaluate
from addernet.engine.evaluation import load_float_model
from addernet.errors import reported
from addernet.quant import inference_model, quantize_for_eval
from addernet.tools.bench import cpu_model, load

REPO = Path(__file__).resolve().parents[1]
ADDERQUANT_DROP = {8: 91.36 - 91.84, 6: 91.21 - 91.84, 5: 90.86 - 91.84, 4: 90.27 - 91.84}  # from the paper's float
SETTINGS = [
    "AdderQuant: quant.weight_grid=signed quant.act_range=quantile quant.bn_recalib=true quant.bn_method=reestimate",
    "defaults:",
]
BUSY = 5.0  # a load average from which a time is not publishable on a 2-core machine


def compose_cfg(overrides):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose("test", overrides=overrides)


def parse_setting(text):
    name, _, rest = text.partition(":")
    return name.strip(), rest.split()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--train", required=True, help="ImageFolder tree of the calibration (training) images")
    p.add_argument("--val", action="append", required=True, help="ImageFolder tree(s) to evaluate on")
    p.add_argument("--calib-images", type=int, default=25600)
    p.add_argument("--bits", default="8,6,5,4")
    p.add_argument("--setting", action="append", help='"NAME: quant.key=value ..." (repeatable)')
    p.add_argument("--json")
    p.add_argument("--markdown")
    a = p.parse_args()
    base_overrides = [
        f"checkpoint={a.checkpoint}",
        "model=resnet20",
        "data=cifar10_folder",
        f"data.train_dir={a.train}",
        f"data.val_dir={a.val[0]}",
        "data.num_workers=0",
        "data.pin_memory=false",
        "trainer.progress=false",
        f"quant.calib_images={a.calib_images}",
    ]
    cfg = compose_cfg(base_overrides)
    base, cfg, _ = load_float_model(cfg, base_overrides, entry="test")
    loaders = {}
    for v in a.val:
        c = copy.deepcopy(cfg)
        c.data.val_dir = v
        loaders[v] = build_loader(c.data, "val")
    meta = {"cpu": cpu_model()[0], "date": time.strftime("%Y-%m-%d"), "calib_images": a.calib_images}
    rows, floats = [], {}

    def record(name, bits, model, seconds, before):
        row = {"setting": name, "bits": bits, "load_before": before}
        for i, (v, loader) in enumerate(loaders.items()):
            start = time.perf_counter()
            r = evaluate(model, loader, "cpu")
            if i == 0 and seconds is not None:
                row["calib_eval_s"] = seconds + time.perf_counter() - start
            row[v] = {"top1": r["top1"], "n": r["n"], "text": format_accuracy(r["top1"], r["n"])}
            if bits is None:
                floats[v] = r["top1"]
            else:
                row[v]["drop"] = r["top1"] - floats[v]
        row["load_after"] = load()[0]
        row["publishable_time"] = max(row["load_before"], row["load_after"]) < BUSY
        rows.append(row)
        print(json.dumps(row), flush=True)

    record("float", None, base.eval(), None, load()[0])
    for text in a.setting or SETTINGS:
        name, overrides = parse_setting(text)
        for bits in (int(b) for b in a.bits.split(",")):
            c = compose_cfg([*base_overrides, f"quant.bits={bits}", *overrides])
            c.data, c.model = cfg.data, cfg.model  # the float checkpoint's effective data and model
            before, start = load()[0], time.perf_counter()
            model, _ = quantize_for_eval(copy.deepcopy(base), c)
            model, _ = inference_model(model.eval(), c.quant.runtime)
            record(name, bits, model, time.perf_counter() - start, before)
    table = markdown(rows, a.val)
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps({**meta, "args": vars(a), "rows": rows}, indent=1))


def markdown(rows, vals):
    head = ["setting", "bits"]
    for v in vals:
        head += [f"top-1 % [95% interval] (correct/n), {os.path.basename(os.path.dirname(v.rstrip('/')))}", "drop"]
    head += ["AdderQuant's drop", "calibration + evaluation s", "load (before/after)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["setting"], "float" if r["bits"] is None else str(r["bits"])]
        for v in vals:
            cells += [r[v]["text"], "" if "drop" not in r[v] else f"{r[v]['drop']:+.2f}"]
        aq = ADDERQUANT_DROP.get(r["bits"])
        secs = r.get("calib_eval_s")
        cells += [
            "" if aq is None else f"{aq:+.2f}",
            "" if secs is None else f"{secs:.1f}" + ("" if r["publishable_time"] else " (busy)"),
            f"{r['load_before']:.1f}/{r['load_after']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    with reported("quant_accuracy.py"):
        main()
