"""Evaluation: ``evaluate`` over a (sharded) loader with the same forward as training (addernet.forward),
and a checkpoint's evaluation as ``test.py`` runs it: config merge, loading, evaluation, the report.

Our checkpoints store their training config: the model and data are rebuilt from it and only what
the command line overrides changes (a ``data=``/``model=`` choice replaces that group; ``data.x=...``
changes one key). Official AdderNet checkpoints (bare state_dicts) store none, so the model and
data come from the command line and configs/test.yaml.
"""

import os
import sys
import time

import torch
import torch.nn as nn
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from .. import distributed as dist
from ..analysis.interval import accuracy_interval, correct_count
from ..checkpoint import OFFICIAL, load_checkpoint, load_weights, open_checkpoint, read_checkpoint
from ..checkpoint.official import load_official
from ..config import config_dir
from ..config.validate import check_schema, one_line
from ..data import build_loader, check_classes, iter_from, take_skipped
from ..errors import ConfigError
from ..forward import logits_and_loss, to_device
from ..models import model_from_config, model_label
from ..ops import Adder2d
from ..quant import check_quant_settings, inference_model, is_quantized_state, prepare_quantized, quantize_for_eval
from .config import check_eval_config, check_stored_model, device_type
from .ema import ema_weights
from .meters import MetricSums
from .outputs import json_line
from .rundir import check_output_path

STORED_GROUPS = ("model", "data")  # taken from our checkpoint's config unless overridden
OFFICIAL_CHOICES = {"model": "resnet20", "data": "cifar10"}  # a checkpoint without a stored config
RESULT_KEYS = ("top1", "top5", "loss", "n", "images_per_s")


@torch.no_grad()
def evaluate(model, loader, device, amp="off", channels_last=False):
    """Evaluate ``model`` on ``loader``; returns {"top1", "top5", "loss", "n", "images_per_s"}.

    Accuracies are in percent, loss is the mean cross-entropy. Under torchrun every rank passes its
    own shard (e.g. build_loader(..., "val", rank=, world_size=), which gives rank r the samples
    r, r+world, ... without padding); the sums are all-reduced, so ``n`` counts each sample exactly
    once and every rank gets the same numbers. Pass the bare model or a DDP wrapper (it is unwrapped,
    so ranks with different numbers of batches never wait on each other). images_per_s is the
    global throughput (all ranks' samples / the slowest rank's wall time).
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    was_training = model.training
    model.eval()
    sums = MetricSums(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    start = time.perf_counter()
    for images, target in iter_from(loader):
        images, target = to_device(images, target, device, memory_format)
        logits, loss_sum = logits_and_loss(model, images, target, amp, reduction="sum")
        sums.update(loss_sum, logits, target)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    if dist.is_distributed():
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    model.train(was_training)
    out = sums.all_reduce().compute()
    out["images_per_s"] = out["n"] / max(seconds.item(), 1e-9)
    return out


def reroot(node, stored, overridden):
    """After a data.root override, move the stored (resolved) train_dir/val_dir that lay under the old root."""
    old, new = str(stored.get("root", "")).rstrip("/"), str(node.get("root", "")).rstrip("/")
    if not old or old == new:
        return
    for key in ("train_dir", "val_dir"):
        value = node.get(key)
        if f"data.{key}" not in overridden and isinstance(value, str) and (value == old or value.startswith(old + "/")):
            node[key] = new + value[len(old) :]


def _overridden(overrides):
    """The dotted keys the command line sets (``data.val_dir=...``, ``~model.include``) and the groups it chooses."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return {o.key_or_group for o in parsed}


def _compose(config_name, overrides):
    try:
        if GlobalHydra.instance().is_initialized():  # inside the entry point's hydra.main
            return compose(config_name=config_name, overrides=overrides)
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from None


def _layer_kinds(cfg):
    """{module name: class name} of the modules holding parameters of the model cfg builds (on the meta device)."""
    with torch.device("meta"):
        model = model_from_config(cfg)
    return {n: type(m).__name__ for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}


def check_stored_layers(cfg, stored, path):
    """ConfigError when the command line changes the kind of a layer the checkpoint's weights were trained in.

    A model option (model.keep_first=false, model.exclude=...) can turn a convolution into an adder layer of the
    same weight shape: the weights would load and compute nonsense.
    """
    if not isinstance((stored or {}).get("model"), dict) or cfg.model.get("name") != stored["model"].get("name"):
        return
    try:
        before = _layer_kinds(OmegaConf.create({"model": stored["model"], "data": stored.get("data") or cfg.data}))
    except (ConfigError, TypeError, ValueError):
        return  # the stored model cannot be rebuilt here: the weights' names and shapes are checked at loading
    after = _layer_kinds(cfg)
    changed = [n for n in before if n in after and before[n] != after[n]]
    if changed:
        name = changed[0]
        raise ConfigError(
            f"{path} was trained with {name} as {before[name]}, but this model builds it as {after[name]} "
            f"({len(changed)} layer(s) changed by the model.* overrides); drop the override to evaluate the "
            f"checkpoint as it was trained."
        )


def effective_config(cfg, stored, overrides, config_name="test"):
    """The config to evaluate a checkpoint with: its stored config as the base, the command line on top.

    For each of the model and data groups: a choice on the command line (``data=...``, or an ``experiment=``
    that chooses it) different from the stored one replaces the group; otherwise the stored option is composed
    with the command line's ``group.key=`` overrides, which the schema checks against that option, and every
    stored key the command line does not set keeps its stored value. ``stored`` None (an official checkpoint):
    the groups configs/test.yaml would otherwise leave empty are the OFFICIAL_CHOICES.
    """
    overridden = _overridden(overrides)
    base = OmegaConf.to_container(cfg)
    extra = []
    for group in STORED_GROUPS:
        name = ((stored or {}).get(group) or {}).get("name") if stored is not None else OFFICIAL_CHOICES[group]
        if base.get(group) is None or "name" not in base[group]:  # the command line chose no option
            if os.path.isfile(os.path.join(config_dir(), group, f"{name}.yaml")):
                extra.append(f"{group}={name}")
    out = _compose(config_name, [*extra, *overrides]) if extra else cfg
    check_schema(out)  # the command line's group.key= against the option it now applies to
    out = OmegaConf.to_container(out, resolve=True)
    for group in STORED_GROUPS:
        node = (stored or {}).get(group)
        if not isinstance(node, dict):
            continue
        if not isinstance(out.get(group), dict) or "name" not in out[group]:  # no option file: the stored group
            out[group] = {**node, **(out.get(group) or {})}
        elif out[group]["name"] == node.get("name"):
            for key, value in node.items():
                if key in out[group] and f"{group}.{key}" not in overridden:
                    out[group][key] = value
            if group == "data" and "data.root" in overridden:
                reroot(out[group], node, overridden)
    return OmegaConf.create(out)


def _load_model(cfg, path, state, stored, kind):
    model = model_from_config(cfg)
    if stored is None:
        origin = " (no config stored in the checkpoint: model/data come from the command line)"
    else:
        m = stored.get("model", {})
        origin = f" (the checkpoint was trained as model={m.get('name')} model.layer={m.get('layer')})"
    hint = (
        f"The model was built from model={cfg.model.name} model.layer={cfg.model.layer} data.num_classes="
        f"{cfg.data.num_classes}{origin}; pick the checkpoint's architecture with model=<name> "
        f"(configs/model/), model.layer=adder|conv and the matching data=<dataset>."
    )
    if is_quantized_state(state):  # a checkpoint of scripts/quantize.py: its quantised layers, loaded as they are
        prepare_quantized(model, state, source=path)
    (load_official if kind == OFFICIAL else load_weights)(model, state, source=path, hint=hint)
    # adder and conv twins have the same tensor names and shapes: loading alone cannot tell them apart
    check_stored_model(
        cfg, stored, path, ("name", "layer"), "evaluate it with the model it was trained as (drop the model override)"
    )
    check_stored_layers(cfg, stored, path)
    if stored is None:
        check_bare_layer(cfg, model, path)
    return model


def _body_norms(cfg):
    """{body layer name: the BatchNorm that takes its output}, from the execution order of the adder twin."""
    twin = OmegaConf.create({"model": {"name": cfg.model.name, "layer": "adder"}, "data": dict(cfg.data)})
    order = []
    with torch.device("meta"):
        net = model_from_config(twin).eval()
        hooks = [
            m.register_forward_hook(lambda mod, i, o, n=n: order.append((n, mod)))
            for n, m in net.named_modules()
            if isinstance(m, (Adder2d, nn.Conv2d, nn.BatchNorm2d))
        ]
        size = int(cfg.data.image_size)
        net(torch.empty(2, int(cfg.data.in_channels), size, size))
    for h in hooks:
        h.remove()
    return {
        a: b for (a, ma), (b, mb) in zip(order, order[1:]) if isinstance(ma, Adder2d) and isinstance(mb, nn.BatchNorm2d)
    }


def check_bare_layer(cfg, model, path):
    """ConfigError when a bare state_dict (no stored config) was trained with the other body layer.

    An adder layer's output -sum|x - w| is never positive, so every channel of the BatchNorm after it has a
    negative running mean; a convolution's outputs have means of both signs. All of them negative in a
    model built with convolutions (or any positive one in an adder model) means the other twin.
    """
    norms = _body_norms(cfg)
    state = model.state_dict()
    means = [state[f"{bn}.running_mean"] for bn in norms.values() if f"{bn}.running_mean" in state]
    if not means or all(float(m.abs().max()) == 0 for m in means):
        return  # untrained statistics: nothing to tell
    adder_like = all(float(m.max()) < 0 for m in means)
    if adder_like != (cfg.model.layer == "adder"):
        trained = "adder" if adder_like else "conv"
        sign = (
            "all negative, as only adder outputs are"
            if adder_like
            else "not all negative, which adder outputs always are"
        )
        raise ConfigError(
            f"{path} holds weights trained as model.layer={trained} (the BatchNorm running means after the "
            f"{len(means)} body layers are {sign}), but the model is built with model.layer={cfg.model.layer}; it "
            f"would load and compute nonsense. Evaluate it with model.layer={trained}."
        )


def check_results_file(results_file, checkpoint=None):
    """ConfigError now, before the evaluation, when results_file= cannot be written (not after minutes of it),
    or would replace the checkpoint or any file other than an earlier results file."""
    if not results_file:
        return
    check_output_path(results_file, "results_file", inputs=(checkpoint,), results=True)
    path = os.path.abspath(str(results_file))
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as e:
        raise ConfigError(
            f"results_file={results_file} cannot be written ({e.strerror or e}); give a writable "
            f"file path, or drop results_file= to print the result only."
        ) from None
    if not existed:
        os.remove(path)


def stored_model(cfg, overrides, entry="test"):
    """What every entry point that reads a checkpoint does first, with the same checks as test.py.

    Returns (model on CPU, effective cfg, path, kind, classes): the command line's keys are checked (unknown
    keys, keys of another option, the top level of configs/<entry>.yaml), the checkpoint is read and merged
    with the command line, and its weights are loaded into the model it was trained as (an adder checkpoint
    is never built as its CNN twin; NaN/inf weights are refused).
    """
    if OmegaConf.is_missing(cfg, "checkpoint") or not str(cfg.checkpoint).strip():  # empty: an unset variable
        raise ConfigError(
            f"no checkpoint given: python {entry}.py checkpoint=PATH (a run's checkpoints/best.pt or "
            f"an official ResNet20-AdderNet.pth / ResNet50-AdderNet.pth)"
        )
    check_quant_settings(cfg.quant)  # every quant.* value, before any work
    path = str(cfg.checkpoint)
    state, stored, kind, classes = open_checkpoint(
        path, model_name=(cfg.get("model") or {}).get("name") or OFFICIAL_CHOICES["model"]
    )
    if cfg.ema:  # test.py ema=true: the exponential moving average of the weights (trainer.ema_decay)
        state = ema_weights(load_checkpoint(path, map_location="cpu"), path)
    cfg = effective_config(cfg, stored, overrides, entry)
    check_eval_config(cfg)
    return _load_model(cfg, path, state, stored, kind), cfg, path, kind, classes


def load_float_model(cfg, overrides, allow_quantized=False, entry="quantize"):
    """(model on CPU in eval mode, effective cfg, checkpoint path) for cfg.checkpoint, read as test.py reads it
    (scripts/quantize.py, export_onnx.py); a quantised checkpoint comes back with its quantised layers when
    allow_quantized (else ConfigError)."""
    model, cfg, path, _, _ = stored_model(cfg, overrides, entry)
    if is_quantized_state(read_checkpoint(path)[0]) and not allow_quantized:
        raise ConfigError(f"{path} is already quantised; pass the float checkpoint it came from.")
    return model.eval(), cfg, path


def evaluate_checkpoint(cfg, overrides):
    """Evaluate cfg.checkpoint; returns the result dict (the same on every rank)."""
    if dist.env_rank() == 0 and not OmegaConf.is_missing(cfg, "checkpoint"):
        check_results_file(cfg.results_file, cfg.checkpoint)
    model, cfg, path, kind, classes = stored_model(cfg, overrides)
    device = dist.init_distributed(device_type(cfg))
    if str(cfg.trainer.device).startswith("cuda:") and not dist.is_distributed():
        device = torch.device(str(cfg.trainer.device))
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    data_cfg = cfg.data
    if device.type != "cuda" and data_cfg.pin_memory:  # pinning needs an accelerator (DataLoader warns)
        data_cfg = OmegaConf.merge(data_cfg, {"pin_memory": False})
    loader = build_loader(data_cfg, "val", rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)
    check_classes(
        classes,
        loader.dataset,
        f"the classes {path} was trained on",
        "evaluate on a folder with the training set's class names (label order = sorted names)",
    )
    if dist.is_main():
        where = cfg.data.get("val_dir") or cfg.data.get("root")
        print(
            f"checkpoint {path} [{kind}]\nmodel {model_label(cfg.model)} | data {cfg.data.name} "
            f"val split ({len(loader.dataset.dataset)} images{f', {where}' if where else ''}) | device {device} x "
            f"{dist.get_world_size()} | amp {cfg.trainer.amp} | weights "
            f"{'ema (the weight average)' if cfg.ema else 'model'}",
            flush=True,
        )
    model, quant = quantize_for_eval(model, cfg, device)  # no-op unless quant.bits or a quantised checkpoint
    if quant:  # the integer network on CPU where it applies (docs/quantization.md), else the quantised layers
        model, quant["runtime"] = inference_model(model, cfg.quant.runtime, device)
    bar = tqdm(  # after calibration: its errors never share a line with this bar
        loader, desc="test", unit="batch", disable=not (dist.is_main() and cfg.trainer.progress), file=sys.stderr
    )
    result = evaluate(model, bar, device, amp=cfg.trainer.amp, channels_last=bool(cfg.trainer.channels_last))
    skipped = take_skipped(loader)
    if skipped:
        print(
            f"test.py: warning: skipped {skipped} unreadable image(s) (data.skip_corrupt=true); n counts the rest",
            file=sys.stderr,
        )
    weights = "ema" if cfg.ema else "model"  # which weights were evaluated (ema=true: the weight average)
    return {**{k: result[k] for k in RESULT_KEYS}, "weights": weights, **({"quant": quant} if quant else {})}


def with_intervals(result):
    """``result`` with the correct counts and the 95% Wilson score intervals (in percent) of top-1 and top-5:
    "top1_correct", "top1_ci95": [low, high], the same for top5 (addernet/analysis/interval.py)."""
    out = dict(result)
    if result.get("n"):
        for k in ("top1", "top5"):
            out[f"{k}_correct"] = correct_count(result[k], result["n"])
            out[f"{k}_ci95"] = accuracy_interval(result[k], result["n"])
    return out


def report(result, results_file):
    """Human-readable summary, then the JSON line (last line printed); also written to results_file.

    The accuracies carry their counts and 95% Wilson intervals (with_intervals). A non-finite loss (a
    diverged model) is written as null: the line stays strict JSON.
    """
    result = with_intervals(result)
    ci = {
        k: f" [{result[k + '_ci95'][0]:.2f}, {result[k + '_ci95'][1]:.2f}] ({result[k + '_correct']}/{result['n']})"
        if k + "_ci95" in result
        else ""
        for k in ("top1", "top5")
    }
    print(
        f"top-1 {result['top1']:.2f}%{ci['top1']} | top-5 {result['top5']:.2f}%{ci['top5']} | "
        f"loss {result['loss']:.4f} | n {result['n']} | {result['images_per_s']:.1f} images/s (95% Wilson intervals)"
    )
    line = json_line(result)
    if results_file:
        os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
        with open(results_file, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)
