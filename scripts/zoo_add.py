"""Add a finished run's final checkpoint to the model zoo (addernet/zoo/) and its manifest.

    python scripts/zoo_add.py RUN_DIR NAME --preset mnist_lenet5_bn_adder --command "python train.py ..." \
        --data-root ../shared/mnist [--quant-bits 8 4]

Takes RUN_DIR/checkpoints/last.pt (the final epoch: a zoo file is chosen by its seed and schedule,
never by test accuracy), drops what only resuming needs (addernet.zoo.inference_checkpoint), writes
addernet/zoo/NAME.pt atomically, evaluates it with ``python test.py`` on --data-root (and, with
--quant-bits, quantised at each bit width as ``test.py quant.bits=B`` does), and records the entry in
addernet/zoo/manifest.json: preset, command, date, seed, sha256, the top-1 test.py printed, the run's
final and best epoch top-1. Exits 2 with one line when the run is unfinished or test.py disagrees with
the run's own last validation.
"""

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from addernet.checkpoint import load_checkpoint, save_checkpoint
from addernet.errors import ConfigError, reported
from addernet.zoo import MANIFEST, ZOO, inference_checkpoint, manifest, sha256

ROOT = Path(__file__).resolve().parents[1]


def evaluate(file, data_root, *extra):
    cmd = [
        sys.executable,
        str(ROOT / "test.py"),
        f"checkpoint={file}",
        f"data.root={data_root}",
        "data.download=false",
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:  # test.py's own exit code
        print(
            f"zoo_add.py: error: {' '.join(cmd)} failed (exit {out.returncode}): {out.stderr.strip()[-500:]}",
            file=sys.stderr,
        )
        sys.exit(out.returncode)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("name")
    ap.add_argument("--preset", required=True, help="the experiment preset the run used")
    ap.add_argument("--command", required=True, help="the command that trained it, as a user would type it")
    ap.add_argument("--data-root", required=True, help="data.root for the evaluation")
    ap.add_argument("--quant-bits", type=int, nargs="*", default=[], help="also evaluate quantised at these widths")
    args = ap.parse_args()

    ckpt = load_checkpoint(args.run_dir / "checkpoints" / "last.pt")
    history, planned = ckpt.get("history") or [], ckpt["config"]["trainer"]["epochs"]
    if ckpt.get("step") or ckpt.get("epoch") != planned or len(history) != planned:
        raise ConfigError(
            f"{args.run_dir} is unfinished (epoch {ckpt.get('epoch')} of {planned}, step "
            f"{ckpt.get('step')}); finish the run first."
        )
    file = ZOO / f"{args.name}.pt"
    save_checkpoint(inference_checkpoint(ckpt), file)
    result = evaluate(file, args.data_root)
    final = history[-1]
    if abs(result["top1"] - final["val_top1"]) > 1e-9:
        sys.exit(
            f"zoo_add.py: error: test.py gives top-1 {result['top1']} for {file}, but the run's last validation "
            f"gave {final['val_top1']}; investigate before publishing."
        )
    best = max(history, key=lambda r: r["val_top1"])
    entry = {
        "file": file.name,
        "preset": args.preset,
        "command": args.command,
        "evaluate": f"python test.py checkpoint=addernet/zoo/{file.name} data.root=<folder holding MNIST/raw> "
        f"data.download=false",
        "date": datetime.date.today().isoformat(),
        "seed": ckpt["config"]["trainer"]["seed"],
        "epochs": planned,
        "sha256": sha256(file),
        "top1": result["top1"],
        "top5": result["top5"],
        "n": result["n"],
        "final_epoch_top1": final["val_top1"],
        "best_epoch_top1": best["val_top1"],
        "best_epoch": best["epoch"],
    }
    for bits in args.quant_bits:
        q = evaluate(file, args.data_root, f"quant.bits={bits}")
        entry.setdefault("quantized_top1", {})[str(bits)] = q["top1"]
        entry["quantize"] = entry["evaluate"] + " quant.bits=<bits>"
    entries = manifest()
    entries[args.name] = entry
    MANIFEST.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    print(json.dumps({args.name: entry}))


if __name__ == "__main__":
    with reported("zoo_add.py"):
        main()
