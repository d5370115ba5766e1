"""Add a finished run's final checkpoint to the model zoo (addernet/zoo/) and its manifest.

    python -m addernet.tools.zoo_add RUN_DIR NAME --preset mnist_lenet5_bn_adder --command "python train.py ..." \\
        --data-root ../shared/mnist [--quant-bits 8 4] [--replace]

(``scripts/zoo_add.py`` is the same command; it runs from a checkout or an installed copy, and a relative
--data-root is the current folder's.) NAME is a plain name (letters, digits, ``_`` and ``-``): the file is
addernet/zoo/NAME.pt. Checks first, writes last:

1. the run is finished (RUN_DIR/checkpoints/last.pt is the last planned epoch: a zoo file is chosen by
   its seed and schedule, never by test accuracy) and is the preset it claims (its stored config is
   ``experiment=PRESET`` composed, apart from where the data lives, how it is fed and the seed);
2. NAME is new, or ``--replace`` says to replace it;
3. the inference checkpoint (addernet.zoo.inference_checkpoint) is evaluated from a temporary file with
   ``python test.py`` on --data-root (and, with --quant-bits, as ``test.py quant.bits=B``), and test.py
   must reproduce the run's own last validation top-1 on its own data;
4. only then addernet/zoo/NAME.pt and manifest.json are written, each atomically.

Any failure exits 2 with one line, before step 4: the zoo is left as it was.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from .. import zoo
from ..checkpoint import load_checkpoint, save_checkpoint
from ..config import config_dir
from ..errors import ConfigError, reported

ROOT = Path(__file__).resolve().parents[2]  # the folder holding this package: a checkout, or site-packages
# Keys that say where the data lives, how it is fed or shown, or which seed: not what the preset trains.
FREE = (
    "data.root",
    "data.download",
    "data.num_workers",
    "data.pin_memory",
    "data.on_device",
    "data.train_dir",
    "data.val_dir",
    "trainer.seed",
    "trainer.progress",
    "trainer.device",
    "trainer.compile",
    "trainer.backend",
    "trainer.dist_timeout",
    "trainer.resume",
    "trainer.resume_override",
    "logger",
)


def _flat(node, prefix=""):
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def preset_differences(stored, preset):
    """``key=run value (preset: value)`` for each setting where the run's stored config differs from
    ``experiment=preset`` composed; keys the run predates (absent from its config) and FREE keys are skipped."""
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            composed = OmegaConf.to_container(compose("train", overrides=[f"experiment={preset}"]), resolve=True)
    except Exception as e:  # Hydra's own "could not find experiment/..." message, in one line
        raise ConfigError(f"--preset {preset}: {str(e).splitlines()[0]}") from None
    want, have = _flat(composed), _flat(stored)
    return [
        f"{k}={have[k]} (preset: {want[k]})"
        for k in sorted(want)
        if k in have and have[k] != want[k] and not any(k == f or k.startswith(f + ".") for f in FREE)
    ]


def check_run(ckpt, run_dir, preset):
    """ConfigError unless ``ckpt`` (the run's last.pt) is a finished run of ``preset``."""
    trainer = (ckpt.get("config") or {}).get("trainer") if isinstance(ckpt, dict) else None
    if not (isinstance(trainer, dict) and isinstance(trainer.get("epochs"), int)):
        raise ConfigError(
            f"{run_dir / 'checkpoints' / 'last.pt'} is not a checkpoint of train.py (it stores no training config); "
            f"give the run dir of a finished train.py run."
        )
    history, planned = ckpt.get("history") or [], trainer["epochs"]
    if ckpt.get("step") or ckpt.get("epoch") != planned or len(history) != planned:
        raise ConfigError(
            f"{run_dir} is unfinished (epoch {ckpt.get('epoch')} of {planned}, step "
            f"{ckpt.get('step')}); finish the run first."
        )
    diff = preset_differences(ckpt["config"], preset)
    if diff:
        raise ConfigError(
            f"{run_dir} is not a run of --preset {preset}: {'; '.join(diff[:6])}"
            f"{f' and {len(diff) - 6} more' if len(diff) > 6 else ''}; train it with experiment={preset}."
        )


def evaluate(file, data_root, *extra):
    """test.py's JSON result for ``file`` (``python -m addernet.test`` of this package, a checkout's or an installed
    copy's); ConfigError with test.py's last words when it fails."""
    cmd = [sys.executable, "-m", "addernet.test", f"checkpoint={file}", f"data.root={data_root}", "data.download=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    out = subprocess.run([*cmd, *extra], capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ConfigError(f"evaluating {file} failed (test.py exit {out.returncode}): {last}; the zoo is unchanged.")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_entry(args, ckpt, file, data_root):
    """The manifest entry of ``file`` (the inference checkpoint, still at its temporary path), from test.py."""
    history = ckpt["history"]
    result = evaluate(file, data_root)
    final = history[-1]
    if abs(result["top1"] - final["val_top1"]) > 1e-9:
        raise ConfigError(
            f"test.py gives top-1 {result['top1']} on --data-root {data_root}, but the run's last validation "
            f"gave {final['val_top1']}: not the run's own data or not the same model; the zoo is unchanged."
        )
    best = max(history, key=lambda r: r["val_top1"])
    dataset = ckpt["config"]["data"].get("name", "data")
    entry = {
        "file": f"{args.name}.pt",
        "preset": args.preset,
        "command": args.command,
        "evaluate": f"python test.py checkpoint=addernet/zoo/{args.name}.pt data.root=<folder holding {dataset}> "
        f"data.download=false",
        "date": datetime.date.today().isoformat(),
        "seed": ckpt["config"]["trainer"]["seed"],
        "epochs": ckpt["config"]["trainer"]["epochs"],
        "top1": result["top1"],
        "top5": result["top5"],
        "n": result["n"],
        "final_epoch_top1": final["val_top1"],
        "best_epoch_top1": best["val_top1"],
        "best_epoch": best["epoch"],
    }
    for bits in args.quant_bits:
        entry.setdefault("quantized_top1", {})[str(bits)] = evaluate(file, data_root, f"quant.bits={bits}")["top1"]
        entry["quantize"] = entry["evaluate"] + " quant.bits=<bits>"
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("name")
    ap.add_argument("--preset", required=True, help="the experiment preset the run used")
    ap.add_argument("--command", required=True, help="the command that trained it, as a user would type it")
    ap.add_argument("--data-root", required=True, help="data.root for the evaluation")
    ap.add_argument("--quant-bits", type=int, nargs="*", default=[], help="also evaluate quantised at these widths")
    ap.add_argument("--replace", action="store_true", help="replace an existing entry of that name")
    args = ap.parse_args(argv)

    target = zoo.ZOO / f"{zoo.check_name(args.name)}.pt"
    if not args.replace and (args.name in zoo.manifest() or target.exists()):
        raise ConfigError(
            f"the zoo already has {args.name!r} ({target}); pass --replace to replace it, or choose another name."
        )
    ckpt = load_checkpoint(args.run_dir / "checkpoints" / "last.pt")
    check_run(ckpt, args.run_dir, args.preset)
    slim = zoo.inference_checkpoint(ckpt)
    with tempfile.TemporaryDirectory(dir=zoo.ZOO, prefix=".zoo_add-") as tmp:  # same file system: os.replace
        trial = save_checkpoint(slim, Path(tmp) / target.name)
        entry = build_entry(args, ckpt, trial, os.path.abspath(args.data_root))
        entry["sha256"] = zoo.sha256(trial)
        os.replace(trial, target)  # the evaluated bytes themselves
    entries = zoo.manifest()
    entries[args.name] = entry
    zoo.write_manifest(entries)
    print(json.dumps({args.name: entry}))


if __name__ == "__main__":
    with reported("zoo_add.py"):
        main()
