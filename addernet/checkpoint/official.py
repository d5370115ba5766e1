"""Official AdderNet checkpoints (huawei-noah/AdderNet) and checked weight loading into our models.

The official files (ResNet20-AdderNet.pth for CIFAR-10, ResNet50-AdderNet.pth for ImageNet) are
plain state_dicts saved from nn.DataParallel: every key starts with `module.`, adder weights are
called `adder` (an adder bias `b`), and they use the legacy (pre-1.6) serialisation with CUDA
storages, which load_checkpoint reads with map_location and weights_only=True. Our models keep the
official module names (addernet/models), so mapping is a rename; no official code is needed.
"""
from collections import OrderedDict
from collections.abc import Mapping

import torch

from ..ops import Adder2d
from .io import CheckpointError

def is_official(obj):
    """True for a bare state_dict (a non-empty mapping of names to tensors), as the official files are.

    Our own checkpoints are dicts holding `model`, `config`, ... (non-tensor values), so they never match.
    """
    return (isinstance(obj, Mapping) and len(obj) > 0
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def official_to_ours(state_dict):
    """Rename official keys to ours: drop `module.`, `<adder>.adder` -> `.weight`, `<adder>.b` -> `.bias`."""
    keys = [k[len("module."):] if k.startswith("module.") else k for k in state_dict]
    adders = {k[:-len(".adder")] for k in keys if k.endswith(".adder")}
    out = OrderedDict()
    for key, value in zip(keys, state_dict.values()):
        module, _, name = key.rpartition(".")
        if name == "adder":
            key = f"{module}.weight"
        elif name == "b" and module in adders:
            key = f"{module}.bias"
        out[key] = value
    return out


def _listing(title, items, limit=12):
    shown = [f"    {x}" for x in items[:limit]]
    if len(items) > limit:
        shown.append(f"    ... and {len(items) - limit} more")
    return [f"  {title} ({len(items)}):"] + shown


def load_weights(model, state_dict, source="checkpoint", hint=""):
    """load_state_dict(strict) with a readable error listing missing, unexpected and mis-shaped keys.

    `source` names the file in the message; `hint` says what to try (e.g. which override picks the model).
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
                 for k, v in state_dict.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if missing or unexpected or misshaped:
        lines = [f"{source} does not fit the model {type(model).__name__} "
                 f"({len(state_dict)} tensors in the checkpoint, {len(expected)} in the model):"]
        for title, items in (("missing in the checkpoint", missing), ("unexpected in the checkpoint", unexpected),
                             ("mis-shaped", misshaped)):
            if items:
                lines += _listing(title, items)
        if hint:
            lines.append(hint)
        raise CheckpointError("\n".join(lines))
    model.load_state_dict(state_dict)
    return model


def load_official(model, state_dict, source="checkpoint", hint=""):
    """Map an official state_dict onto `model` (see official_to_ours) and load it, checked.

    Besides names and shapes, every official `adder` tensor must land in an Adder2d: an adder checkpoint
    loaded into the CNN twin (model.layer=conv) has the same names and shapes but would compute nonsense.
    """
    state = official_to_ours(state_dict)
    modules = dict(model.named_modules())
    adders = sorted({k[len("module."):] if k.startswith("module.") else k for k in state_dict
                     if k.endswith(".adder")})
    wrong = [k[:-len(".adder")] for k in adders if k[:-len(".adder")] in modules
             and not isinstance(modules[k[:-len(".adder")]], Adder2d)]
    if wrong:
        raise CheckpointError("\n".join([f"{source} holds adder weights, but the model builds these layers as "
                                         f"{type(modules[wrong[0]]).__name__}, not Adder2d:"] + _listing(
                                             "non-adder layers", wrong)[1:] + ([hint] if hint else [])))
    return load_weights(model, state, source, hint)
