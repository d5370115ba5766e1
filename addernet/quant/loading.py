"""The float model of a checkpoint, as test.py builds it, for scripts/quantize.py and scripts/export_onnx.py.

It reuses test.py's own reading of checkpoints (ours with a stored config, or official state_dicts)
and its merging of the stored config with the command line (addernet.engine.eval_run), so the
scripts accept exactly the arguments test.py does.
"""
from omegaconf import OmegaConf

from ..checkpoint import OFFICIAL, load_weights, read_checkpoint
from ..checkpoint.official import load_official
from ..engine import ConfigError, check_eval_config, model_from_config
from ..engine.eval_run import effective_config


def load_float_model(cfg, overrides, allow_quantized=False):
    """(model on CPU in eval mode, effective cfg, checkpoint path) for cfg.checkpoint; a quantised
    checkpoint comes back with its quantised layers when allow_quantized (else ConfigError)."""
    from .convert import prepare_quantized
    from .format import is_quantized_state

    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError("no checkpoint given: checkpoint=PATH (ours or an official ResNet20-AdderNet.pth)")
    path = str(cfg.checkpoint)
    state, stored, kind = read_checkpoint(path)
    if stored is not None:
        cfg = effective_config(cfg, stored, list(overrides))
    check_eval_config(cfg)
    model = model_from_config(cfg)
    if is_quantized_state(state):
        if not allow_quantized:
            raise ConfigError(f"{path} is already quantised; pass the float checkpoint it came from.")
        prepare_quantized(model, state, source=path)
    (load_official if kind == OFFICIAL else load_weights)(model, state, source=path)
    return model.eval(), cfg, path
