"""Quantised checkpoints: our checkpoint format plus a top-level "quant" entry, loadable weights_only.

    {"format_version": 1, "model": state_dict, "config": the source's config, "quant": settings}

The state_dict holds, for every adder layer, the QAdder2d buffers (integer weights `qweight`, `group`,
`scale`, `bias_term`, `act_range`, `bits`) instead of the float weight, and the re-estimated BatchNorm
statistics; so the model is rebuilt from the stored config and evaluated without calibrating again.
"quant" records the settings used (bits, groups, calibration, source checkpoint) for the results.
"""

from ..checkpoint import CheckpointError, load_checkpoint, load_weights, save_checkpoint
from .convert import prepare_quantized

FORMAT_VERSION = 1


def is_quantized_state(state):
    """True for a state_dict holding quantised adder layers."""
    return any(isinstance(k, str) and k.endswith(".qweight") for k in state)


def save_quantized(path, model, config, settings):
    """Write the quantised `model` with the source `config` (plain dict) and quant `settings` (plain dict)."""
    return save_checkpoint(
        {"format_version": FORMAT_VERSION, "model": model.state_dict(), "config": config, "quant": dict(settings)}, path
    )


def load_quantized_into(model, path, kernel="auto", ckpt=None):
    """Load the quantised checkpoint `path` (or its already read `ckpt`) into the float `model` built from its
    config, as QAdder2d layers; returns (model, ckpt). addernet.quant.load_quantized(path) builds the model too."""
    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    if not (
        isinstance(ckpt, dict)
        and isinstance(ckpt.get("quant"), dict)
        and isinstance(ckpt.get("model"), dict)
        and is_quantized_state(ckpt["model"])
    ):
        raise CheckpointError(
            f"{path} is not a quantised checkpoint (no 'quant' entry with quantised adder layers); "
            f"write one with scripts/quantize.py."
        )
    prepare_quantized(model, ckpt["model"], kernel, source=str(path))
    load_weights(model, ckpt["model"], source=str(path))
    return model, ckpt
