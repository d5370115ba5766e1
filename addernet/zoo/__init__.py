"""Checkpoints trained with this repository and shipped with it: the ``.pt`` files beside this module.

``manifest.json`` names, for each file, the preset and the command that trained it, the date, the
seed (zoo files are chosen by seed, never by test accuracy), the file's sha256 and the top-1 that
``python test.py checkpoint=<file>`` prints for it. Evaluate one with
``python test.py checkpoint=addernet/zoo/<name>.pt data.root=<folder holding MNIST/raw>``.

A zoo file is the final epoch's training checkpoint without the state that only resuming needs
(optimizer, scheduler, RNG): :func:`inference_checkpoint`. Loading one, by name (:func:`path`) or by
its path (``load_checkpoint``), checks its sha256 against the manifest first (:func:`verify`), so a
changed or damaged file is refused instead of evaluated. ``python -m addernet.tools.zoo_add`` adds one.
"""

import hashlib
import json
import os
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
    file = ZOO / entries[name]["file"]
    verify(file)
    return file


def sha256(file):
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def verify(file):
    """CheckpointError when ``file`` is a zoo file whose bytes are not the ones its manifest entry hashed;
    any other file passes."""
    file = Path(file).resolve()
    if file.parent != ZOO.resolve() or not file.is_file():
        return
    entry = next((e for e in manifest().values() if e.get("file") == file.name), None)
    if entry is not None and sha256(file) != entry["sha256"]:
        raise CheckpointError(
            f"{file} is not the file its manifest entry describes (sha256 {sha256(file)[:16]}..., "
            f"{MANIFEST.name} says {entry['sha256'][:16]}...): it was changed or damaged; restore it "
            f"(git checkout -- addernet/zoo/{file.name}, or re-clone) before using it."
        )


def write_manifest(entries):
    """Replace manifest.json with ``entries`` atomically (a crash leaves the old manifest or the new one)."""
    tmp = MANIFEST.with_name(f".{MANIFEST.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(entries, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, MANIFEST)


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
