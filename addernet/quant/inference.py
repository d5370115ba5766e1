"""Running a quantised model for inference: the integer network where it applies, else the layers.

    net = addernet.quant.load_quantized("q8.pt")      # an nn.Module for CPU inference
    logits = net(images)

runtime (quant.runtime for test.py): "auto" runs the integer network (intnet.IntegerResNet: integer
activations between adder layers, one kernel call for the body) on CPU for the CIFAR ResNets and
the layer-by-layer QAdder2d model otherwise; "integer" requires the integer network (an error where
it does not apply); "layers" always runs the QAdder2d model. The runtime's name says why "auto" fell back to
the layers, so the result shows what ran.
"""

from ..checkpoint import CheckpointError, load_checkpoint
from ..errors import ConfigError
from ..models import build_model
from .convert import RUNTIMES
from .format import load_quantized_into
from .intnet import IntegerResNet, unsupported_reason
from .qadder import _int_kernel


def inference_model(model, runtime="auto", device="cpu"):
    """(module to evaluate, "integer network" or "layers") for the quantised `model` (eval mode)."""
    if runtime not in RUNTIMES:
        raise ConfigError(f"quant.runtime={runtime!r}: choose one of {', '.join(RUNTIMES)}.")
    if runtime == "layers":
        return model, "layers"
    kernels = {getattr(m, "kernel", "auto") for m in model.modules() if hasattr(m, "qweight")}
    why = unsupported_reason(model)
    if why is None and str(device).split(":")[0] != "cpu":
        why = f"it runs on CPU only, not on {device}"
    if why is None and "fake" in kernels:
        why = "quant.kernel=fake asks for the float fake-quantised layers"
    if why is None and _int_kernel() is None:
        why = "the integer kernel could not be built"
    if why is None:
        return IntegerResNet(model.eval()), "integer network"
    if runtime == "integer":
        raise ConfigError(f"quant.runtime=integer: no integer network here: {why}; use quant.runtime=auto or layers.")
    return model, f"layers (no integer network: {why})"


def load_quantized(path, runtime="auto"):
    """The quantised checkpoint `path` (scripts/quantize.py) as an nn.Module for CPU inference in eval mode:
    the integer network for the CIFAR ResNets (runtime="auto"), else the QAdder2d model (see the module doc)."""
    ckpt = load_checkpoint(path)
    config = ckpt.get("config") if isinstance(ckpt, dict) else None
    model_cfg = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model_cfg, dict) or "name" not in model_cfg:
        raise CheckpointError(f"{path} stores no model config (config.model.name); write it with scripts/quantize.py.")
    data_cfg = config.get("data") or {}
    model = build_model(
        model_cfg["name"],
        layer=model_cfg.get("layer", "adder"),
        num_classes=int(data_cfg.get("num_classes", 10)),
        in_channels=data_cfg.get("in_channels"),
        **{k: v for k, v in model_cfg.items() if k not in ("name", "layer")},  # the stored options (arch, exclude)
    )
    model, _ = load_quantized_into(model.eval(), path, ckpt=ckpt)
    return inference_model(model.eval(), runtime)[0]
