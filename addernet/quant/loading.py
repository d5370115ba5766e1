"""The float model of a checkpoint, as test.py builds it, for scripts/quantize.py and scripts/export_onnx.py.

It reuses test.py's own reading of checkpoints (ours with a stored config, or official state_dicts)
and its merging of the stored config with the command line, so the scripts accept exactly the
arguments test.py does. (When test.py's helpers move into the library, import them from there.)
"""
import importlib.util
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint import load_weights
from ..checkpoint.official import load_official
from ..engine import ConfigError, check_config, model_from_config

REPO = Path(__file__).resolve().parents[2]


def _test_py():
    spec = importlib.util.spec_from_file_location("addernet_test_entry", REPO / "test.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_float_model(cfg, overrides, allow_quantized=False):
    """(model on CPU in eval mode, effective cfg, checkpoint path) for cfg.checkpoint; a quantised
    checkpoint comes back with its quantised layers when allow_quantized (else ConfigError)."""
    from .convert import prepare_quantized
    from .format import is_quantized_state

    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError("no checkpoint given: checkpoint=PATH (ours or an official ResNet20-AdderNet.pth)")
    t = _test_py()
    path = str(cfg.checkpoint)
    state, stored, kind = t.read_checkpoint(path)
    if stored is not None:
        cfg = t.effective_config(cfg, stored, list(overrides))
    check_config(cfg)
    model = model_from_config(cfg)
    if is_quantized_state(state):
        if not allow_quantized:
            raise ConfigError(f"{path} is already quantised; pass the float checkpoint it came from.")
        prepare_quantized(model, state, source=path)
    (load_official if kind == t.OFFICIAL else load_weights)(model, state, source=path)
    return model.eval(), cfg, path
