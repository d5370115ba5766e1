"""Evaluate a checkpoint: ``python test.py checkpoint=PATH [data=...] [data.root=...] [model=...]``.

Our checkpoints store their training config: the model and data are rebuilt from it and only what
the command line overrides changes (a `data=`/`model=` choice replaces that group; `data.x=...`
changes one key). Official AdderNet checkpoints (bare state_dicts) store none, so the model and
data come from the command line and configs/test.yaml. Prints a summary; the last line printed is
one JSON object {"top1", "top5", "loss", "n", "images_per_s"} (accuracies in percent).
Works on CPU or GPU (trainer.device), in one process or under torchrun.
"""
import json
import os
import sys

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from addernet import distributed as dist
from addernet.checkpoint import CheckpointError, load_checkpoint, load_weights
from addernet.checkpoint.official import is_official, load_official
from addernet.data import DataError, build_loader
from addernet.engine import ConfigError, check_config, device_type, evaluate, model_from_config
from addernet.quant import is_quantized_state, prepare_quantized, quantize_for_eval

STORED_GROUPS = ("model", "data")  # taken from our checkpoint's config unless overridden
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
_implied = []  # overrides test.py added to the command line itself (see imply_data_choice)
_peeked = {}  # path -> checkpoint already loaded by imply_data_choice (read once, not twice)
RESULT_KEYS = ("top1", "top5", "loss", "n", "images_per_s")
OFFICIAL = "state_dict (official AdderNet format)"


def read_checkpoint(path):
    """(state_dict, stored config or None, kind) for our checkpoints and bare (official) state_dicts."""
    ckpt = _peeked.pop(str(path), None) or load_checkpoint(path, map_location="cpu")
    if is_official(ckpt):
        return ckpt, None, OFFICIAL
    if isinstance(ckpt, dict) and is_official(ckpt.get("model")):
        stored = ckpt.get("config")
        return ckpt["model"], stored if isinstance(stored, dict) else None, f"addernet v{ckpt.get('format_version')}"
    found = ", ".join(map(str, list(ckpt)[:10])) if isinstance(ckpt, dict) else type(ckpt).__name__
    raise CheckpointError(f"{path} is neither a checkpoint of this repo (a dict with 'model' and 'config') nor a "
                          f"bare state_dict such as the official AdderNet files; found: {found}.")


def imply_data_choice(argv):
    """`data=<name>` of the config stored in the checkpoint named in argv, or None.

    Hydra composes before main() runs, and a `data.val_dir=...` override fails to compose when the
    default data group (cifar10) lacks that key. Composing the checkpoint's own data group makes every
    override of its keys valid; main() then treats this choice as not given by the user.
    """
    paths = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("checkpoint=")]
    if not paths or any(a.lstrip("+~").split("=")[0] in ("data", "experiment") for a in argv):
        return None
    try:
        ckpt = load_checkpoint(paths[-1], map_location="cpu")
    except CheckpointError:
        return None  # reported by main()
    _peeked[paths[-1]] = ckpt
    stored = ckpt.get("config") if isinstance(ckpt, dict) and not is_official(ckpt) else None
    name = stored.get("data", {}).get("name") if isinstance(stored, dict) else None
    if isinstance(name, str) and os.path.isfile(os.path.join(CONFIGS, "data", f"{name}.yaml")):
        return f"data={name}"
    return None


def _reroot(node, stored, overridden):
    """After a data.root override, move the stored (resolved) train_dir/val_dir that lay under the old root."""
    old, new = str(stored.get("root", "")).rstrip("/"), str(node.get("root", "")).rstrip("/")
    if not old or old == new:
        return
    for key in ("train_dir", "val_dir"):
        value = node.get(key)
        if f"data.{key}" not in overridden and isinstance(value, str) and (value == old or value.startswith(old + "/")):
            node[key] = new + value[len(old):]


def effective_config(cfg, stored, overrides):
    """`cfg` with the model/data groups of the checkpoint's `stored` config, except what the user overrode.

    `overrides` are the command-line overrides (HydraConfig overrides.task): a group choice
    (`data=...`, `model=...`, `experiment=...`) keeps the composed group; `group.key=value` changes one
    stored key (its value read from the composed cfg, so Hydra's parsing and types apply).
    """
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    chosen = {o.key_or_group for o in parsed if "." not in o.key_or_group}
    if "experiment" in chosen:
        chosen.update(STORED_GROUPS)
    overridden = {o.key_or_group for o in parsed}
    out = OmegaConf.to_container(cfg, resolve=True)
    for group in STORED_GROUPS:
        if group in chosen or not isinstance(stored.get(group), dict):
            continue
        node = dict(stored[group])
        for o in parsed:
            if not o.key_or_group.startswith(group + "."):
                continue
            sub = OmegaConf.create(node)
            key = o.key_or_group[len(group) + 1:]
            if o.is_delete():
                parent, _, leaf = key.rpartition(".")
                target = OmegaConf.select(sub, parent) if parent else sub
                if target is not None and leaf in target:
                    del target[leaf]
            else:
                OmegaConf.update(sub, key, OmegaConf.select(cfg, o.key_or_group), force_add=True)
            node = OmegaConf.to_container(sub)
        if group == "data" and "data.root" in overridden:
            _reroot(node, stored[group], overridden)
        out[group] = node
    return OmegaConf.create(out)


def run(cfg, overrides):
    """Evaluate cfg.checkpoint; returns the result dict (the same on every rank)."""
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError("no checkpoint given: python test.py checkpoint=PATH (a run's checkpoints/best.pt or an "
                          "official ResNet20-AdderNet.pth / ResNet50-AdderNet.pth)")
    path = str(cfg.checkpoint)
    state, stored, kind = read_checkpoint(path)
    if stored is not None:
        cfg = effective_config(cfg, stored, overrides)
    check_config(cfg)
    device = dist.init_distributed(device_type(cfg))
    if str(cfg.trainer.device).startswith("cuda:") and not dist.is_distributed():
        device = torch.device(str(cfg.trainer.device))
    main = dist.is_main()
    model = model_from_config(cfg)
    if stored is None:
        origin = " (no config stored in the checkpoint: model/data come from the command line)"
    else:
        m = stored.get("model", {})
        origin = f" (the checkpoint was trained as model={m.get('name')} model.layer={m.get('layer')})"
    hint = (f"The model was built from model={cfg.model.name} model.layer={cfg.model.layer} data.num_classes="
            f"{cfg.data.num_classes}{origin}; pick the checkpoint's architecture with model=<name> "
            f"(configs/model/), model.layer=adder|conv and the matching data=<dataset>.")
    if is_quantized_state(state):  # a checkpoint of scripts/quantize.py: quantised layers, loaded as they are
        prepare_quantized(model, state, source=path)
    (load_official if kind == OFFICIAL else load_weights)(model, state, source=path, hint=hint)
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    if device.type != "cuda" and cfg.data.get("pin_memory"):
        cfg.data.pin_memory = False  # pinning needs an accelerator; avoids DataLoader's warning on CPU
    loader = build_loader(cfg.data, "val", rank=dist.get_rank(), world_size=dist.get_world_size())
    if main:
        where = cfg.data.get("val_dir") or cfg.data.get("root")
        print(f"checkpoint {path} [{kind}]\nmodel {cfg.model.name} ({cfg.model.layer}) | data {cfg.data.name} "
              f"val split ({len(loader.dataset.dataset)} images{f', {where}' if where else ''}) | device {device} x "
              f"{dist.get_world_size()} | amp {cfg.trainer.amp}", flush=True)
    model, quant = quantize_for_eval(model, cfg, device)  # no-op unless quant.bits or a quantised checkpoint
    bar = tqdm(loader, desc="test", unit="batch", disable=not (main and cfg.trainer.progress), file=sys.stderr)
    result = evaluate(model, bar, device, amp=cfg.trainer.amp, channels_last=bool(cfg.trainer.channels_last))
    return {**{k: result[k] for k in RESULT_KEYS}, **({"quant": quant} if quant else {})}


def report(result, results_file):
    """Human-readable summary, then the JSON line (last line printed); also written to results_file."""
    print(f"top-1 {result['top1']:.2f}% | top-5 {result['top5']:.2f}% | loss {result['loss']:.4f} | "
          f"n {result['n']} | {result['images_per_s']:.1f} images/s")
    line = json.dumps(result)
    if results_file:
        os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
        with open(results_file, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="test")
def main(cfg):
    try:
        result = run(cfg, [o for o in HydraConfig.get().overrides.task if o not in _implied])
        if dist.is_main():
            report(result, cfg.results_file)
    except (CheckpointError, ConfigError, DataError, OmegaConfBaseException) as e:
        print(f"test.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        dist.cleanup()


if __name__ == "__main__":
    implied = imply_data_choice(sys.argv[1:])
    if implied:
        _implied.append(implied)
        sys.argv.append(implied)
    main()
