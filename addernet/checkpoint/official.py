"""Official AdderNet checkpoints (huawei-noah/AdderNet) and their mapping onto our models.

The official files (ResNet20-AdderNet.pth for CIFAR-10, ResNet50-AdderNet.pth for ImageNet) are
plain state_dicts saved from nn.DataParallel: every key starts with `module.`, adder weights are
called `adder` (an adder bias `b`), and they use the legacy (pre-1.6) serialisation with CUDA
storages, which load_checkpoint reads with map_location and weights_only=True. Our models keep the
official module names (addernet/models), so mapping is a rename; no official code is needed.
``convert_official`` writes an official file as a checkpoint of this repository (scripts/convert_official.py).

The official AdderNet code and checkpoints: Copyright (C) 2020 Huawei Technologies Co., Ltd., BSD 3-Clause
(the notice is in LICENSE).
"""

import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping

import torch

from ..ops import Adder2d
from .io import CheckpointError, _listing, load_checkpoint, load_weights, save_checkpoint

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# model name -> the class names (label order) of the official checkpoint of that model
OFFICIAL_CLASSES = {"resnet20": list(CIFAR10_CLASSES)}


def is_official(obj):
    """True for a bare state_dict (a non-empty mapping of names to tensors), as the official files are.

    Our own checkpoints are dicts holding `model`, `config`, ... (non-tensor values), so they never match.
    """
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def official_to_ours(state_dict):
    """Rename official keys to ours: drop `module.`, `<adder>.adder` -> `.weight`, `<adder>.b` -> `.bias`."""
    keys = [k[len("module.") :] if k.startswith("module.") else k for k in state_dict]
    adders = {k[: -len(".adder")] for k in keys if k.endswith(".adder")}
    out = OrderedDict()
    for key, value in zip(keys, state_dict.values()):
        module, _, name = key.rpartition(".")
        if name == "adder":
            key = f"{module}.weight"
        elif name == "b" and module in adders:
            key = f"{module}.bias"
        out[key] = value
    return out


def load_official(model, state_dict, source="checkpoint", hint=""):
    """Map an official state_dict onto `model` (see official_to_ours) and load it, checked.

    Besides names and shapes, every official `adder` tensor must land in an Adder2d: an adder checkpoint
    loaded into the CNN twin (model.layer=conv) has the same names and shapes but would compute nonsense.
    """
    state = official_to_ours(state_dict)
    modules = dict(model.named_modules())
    adders = sorted({k[len("module.") :] if k.startswith("module.") else k for k in state_dict if k.endswith(".adder")})
    wrong = [
        k[: -len(".adder")]
        for k in adders
        if k[: -len(".adder")] in modules and not isinstance(modules[k[: -len(".adder")]], Adder2d)
    ]
    if wrong:
        raise CheckpointError(
            "\n".join(
                [
                    f"{source} holds adder weights, but the model builds these layers as "
                    f"{type(modules[wrong[0]]).__name__}, not Adder2d:"
                ]
                + _listing("non-adder layers", wrong)[1:]
                + ([hint] if hint else [])
            )
        )
    return load_weights(model, state, source, hint)


def convert_official(src, dst, model, config, *, format_version, hint=""):
    """Write the official checkpoint file ``src`` as a checkpoint of this repository at ``dst``; returns ``dst``.

    ``config``: ``{"model": {...}, "data": {...}}``, the groups as configs/test.yaml composes them, stored so that
    test.py needs no model= override; ``model``: the network built from it. The weights are loaded into it
    (checked: names, shapes, adder layers) before anything is written; the file is written atomically and
    records the source file's name and sha256. ``format_version``: addernet.checkpoint.FORMAT_VERSION (format.py
    reads official files with this module, so this module does not import it).
    """
    ckpt = load_checkpoint(src, map_location="cpu")
    if not is_official(ckpt):
        mine = isinstance(ckpt, dict) and "config" in ckpt
        raise CheckpointError(
            f"{src} is not a bare state_dict like the official AdderNet checkpoints"
            + (" (it already is a checkpoint of this repo)" if mine else "")
            + "; nothing to convert."
        )
    load_official(model, ckpt, source=src, hint=hint)
    digest = hashlib.sha256()
    with open(src, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    out = {
        "format_version": format_version,
        "model": official_to_ours(ckpt),
        "config": config,
        "source": {
            "file": os.path.basename(src),
            "sha256": digest.hexdigest(),
            "converted_by": "scripts/convert_official.py",
        },
    }
    name = config["model"]["name"]
    if name in OFFICIAL_CLASSES and config["data"]["name"] == "cifar10":  # the labels the official weights learnt
        out["classes"] = OFFICIAL_CLASSES[name]
    return save_checkpoint(out, dst)
