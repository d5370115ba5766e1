"""Checkpoints trained with this repository and shipped with it: the ``.pt`` files beside this module.

``manifest.json`` names, for each file, the preset and the command that trained it, the date, the
seed (zoo files are chosen by seed, never by test accuracy), the file's sha256 and the top-1 that
``python test.py checkpoint=<file>`` prints for it. Evaluate one with
``python test.py checkpoint=addernet/zoo/<name>.pt data.root=<folder holding MNIST/raw>``.

A zoo file is the final epoch's training checkpoint without the state that only resuming needs
(optimizer, scheduler, RNG): :func:`inference_checkpoint`.
"""

import hashlib
import json
from pathlib import Path

from ..errors import CheckpointError

ZOO = Path(__file__).resolve().parent
MANIFEST = ZOO / "manifest.json"
KEPT = ("format_version", "model", "config", "classes", "epoch", "best_top1", "best_epoch", "history", "world_size")


def manifest():
    """{name: entry} of every zoo checkpoint (see manifest.json)."""
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def path(name):
    """The file of zoo checkpoint ``name``; CheckpointError naming the available ones otherwise."""
    entries = manifest()
    if name not in entries:
        raise CheckpointError(f"no zoo checkpoint named {name!r}; available: {', '.join(sorted(entries)) or 'none'}.")
    return ZOO / entries[name]["file"]


def sha256(file):
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def inference_checkpoint(ckpt, data_root="data"):
    """``ckpt`` (a training checkpoint dict) without optimizer, scheduler, scaler, RNG and partial-epoch state.

    The stored config's ``data.root`` is reset to ``data_root`` so that no path of the training machine
    is shipped; test.py's ``data.root=`` points it at the user's copy.
    """
    slim = {k: ckpt[k] for k in KEPT if k in ckpt}
    config = dict(slim.get("config") or {})
    if isinstance(config.get("data"), dict):
        config["data"] = {**config["data"], "root": data_root}
    slim["config"] = config
    return slim
