"""Training-throughput table of train.py run dirs (scripts/gpu_check.sh, stage 4).

    python scripts/summarize_runs.py RUN_DIR [RUN_DIR ...] [--epochs 400] [--json PATH]

Per run: model.layer, data path (data.on_device), trainer.compile, the last epoch's train and
validation images/s and epoch seconds (the first epoch is warm-up: autotuning, compilation, cuDNN
benchmarking; it is used only when it is the only one), and the projected time of the full recipe:
``epochs x (50,000 / train img/s + 10,000 / val img/s + overhead)``, CIFAR-10's split sizes at the
measured rates, where overhead is the rest of the measured epoch (data-loader start, seeding).
Checkpoint writes between epochs are not counted. The notes column says when the run's train.log
shows that data.on_device did not hold the data on the GPU, or that trainer.compile was set but no
compilation was logged (the engine does not call addernet.compile.compile_model).
"""
import argparse
import json
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

CIFAR_TRAIN, CIFAR_VAL = 50_000, 10_000


def summarize(run_dir, epochs=400):
    """One row (dict) for ``run_dir``; raises ValueError naming the file when the run left no metrics."""
    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file() or not metrics.read_text().strip():
        raise ValueError(f"{metrics} is missing or empty: the run did not finish an epoch (see {run / 'train.log'}).")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    cfg = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    log = (run / "train.log").read_text() if (run / "train.log").is_file() else ""
    counts = re.search(r"(\d+) train / (\d+) val images", log)
    last = records[-1]
    n_train, n_val = (int(counts[1]), int(counts[2])) if counts else (None, None)
    ips, vips = last["images_per_s"], last["val_images_per_s"]
    overhead = max(last["epoch_seconds"] - n_train / ips - n_val / vips, 0.0) if counts else 0.0
    on_device, compiled = bool(cfg["data"].get("on_device", False)), bool(cfg["trainer"].get("compile", False))
    notes = []
    if len(records) == 1:
        notes.append("one epoch only: includes warm-up")
    device = re.search(r"\| device (\S+)", log)
    held = re.search(r"data\.on_device: train split held on (\S+)", log)
    if on_device and device and held and held[1] != device[1]:
        notes.append(f"data held on {held[1]}, not {device[1]} (build_loader got no device)")
    if compiled and "trainer.compile:" not in log:
        notes.append("not compiled (engine does not call compile_model)")
    return {"run": run.name, "model": f"{cfg['model']['name']} {cfg['model']['layer']}",
            "data": "device" if on_device else "DataLoader", "compile": compiled,
            "device": device[1] if device else "?", "epochs_run": len(records), "train_img_s": ips,
            "val_img_s": vips, "epoch_s": last["epoch_seconds"], "overhead_s": overhead,
            "projected_h": epochs * (CIFAR_TRAIN / ips + CIFAR_VAL / vips + overhead) / 3600, "notes": notes}


def table(rows, epochs):
    head = (f"| model | data | compile | device | train img/s | val img/s | epoch s (last) | "
            f"projected {epochs} epochs | notes |")
    lines = [head, "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['data']} | {'on' if r['compile'] else 'off'} | {r['device']} | "
                     f"{r['train_img_s']:.0f} | {r['val_img_s']:.0f} | {r['epoch_s']:.2f} | "
                     f"{r['projected_h']:.2f} h | {'; '.join(r['notes'])} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="train.py run dirs (hydra.run.dir)")
    ap.add_argument("--epochs", type=int, default=400, help="epochs of the recipe to project (paper: 400)")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)
    rows, missing = [], []
    for run in a.runs:
        try:
            rows.append(summarize(run, a.epochs))
        except (ValueError, OSError) as e:
            missing.append(f"{run}: {e}")
    if rows:
        print(table(rows, a.epochs))
    for line in missing:
        print(f"not measured: {line}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
