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
import re
from pathlib import Path

from ..errors import CheckpointError, ConfigError

ZOO = Path(__file__).resolve().parent
MANIFEST = ZOO / "manifest.json"
KEPT = ("format_version", "model", "config", "classes", "epoch", "best_top1", "best_epoch", "history", "world_size")


# a zoo name: the file is <name>.pt in the zoo folder, so no path separators, dots or leading dash
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
RESTORE = "restore it (git checkout -- addernet/zoo/manifest.json, or re-install the package)"


def check_name(name):
    """ConfigError unless ``name`` is a plain zoo name (letters, digits, ``_`` and ``-``; not ending in .pt)."""
    if NAME.fullmatch(name):
        return name
    hint = f" (without .pt: {name[:-3]})" if name.endswith(".pt") and NAME.fullmatch(name[:-3]) else ""
    raise ConfigError(
        f"zoo name {name!r} is not a plain name; use letters, digits, _ and - only, starting with a letter or a digit"
        f"{hint}: the file is addernet/zoo/<name>.pt."
    )


def manifest():
    """{name: entry} of every zoo checkpoint (see manifest.json); CheckpointError naming the file when it is not a
    JSON object (a damaged entry is refused only where it is used: :func:`entry_of`)."""
    if not MANIFEST.exists():
        return {}
    try:
        entries = json.loads(MANIFEST.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{MANIFEST} is damaged ({e}); {RESTORE}.") from None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{MANIFEST} is damaged (not a JSON object of entries); {RESTORE}.")
    return entries


def _intact(entry):
    if not (isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("file", "sha256"))):
        return False
    return entry["file"].endswith(".pt") and bool(NAME.fullmatch(entry["file"][:-3]))


def entry_of(name, entry):
    """``entry`` (manifest entry ``name``) when it has a sha256 and its file is a zoo file name (``<name>.pt`` in the
    zoo folder); CheckpointError naming the manifest and the entry otherwise."""
    if _intact(entry):
        return entry
    raise CheckpointError(
        f"{MANIFEST} is damaged: its entry {name!r} has no sha256 or no zoo file name (<name>.pt); {RESTORE}."
    )


def path(name):
    """The file of zoo checkpoint ``name``; CheckpointError naming the available ones otherwise."""
    entries = manifest()
    if name not in entries:
        raise CheckpointError(f"no zoo checkpoint named {name!r}; available: {', '.join(sorted(entries)) or 'none'}.")
    file = ZOO / entry_of(name, entries[name])["file"]
    verify(file)
    return file


def sha256(file):
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def verify(file):
    """CheckpointError when ``file`` is a zoo file whose bytes are not the ones its manifest entry hashed, or whose
    entry is damaged (or may be: a damaged entry whose file cannot be told); any other file passes."""
    file = Path(file).resolve()
    if file.parent != ZOO.resolve() or not file.is_file():
        return
    entries = manifest()
    named = [(n, e) for n, e in entries.items() if isinstance(e, dict) and e.get("file") == file.name]
    if not named:  # not a zoo file, unless a damaged entry may be this file's
        damaged = next((n for n, e in entries.items() if not _intact(e)), None)
        if damaged is not None:
            entry_of(damaged, entries[damaged])
        return
    entry = entry_of(*named[0])
    if sha256(file) != entry["sha256"]:
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
