"""The float model of a checkpoint, as test.py builds it, for scripts/quantize.py and scripts/export_onnx.py.

It reuses test.py's own reading of checkpoints (ours with a stored config, or official state_dicts)
and its merging of the stored config with the command line (addernet.engine.eval_run), so the
scripts accept exactly the arguments test.py does.
"""
from ..checkpoint import read_checkpoint
from ..engine import ConfigError
from ..engine.eval_run import stored_model


def load_float_model(cfg, overrides, allow_quantized=False, entry="quantize"):
    """(model on CPU in eval mode, effective cfg, checkpoint path) for cfg.checkpoint; a quantised
    checkpoint comes back with its quantised layers when allow_quantized (else ConfigError)."""
    from .format import is_quantized_state

    model, cfg, path, _, _ = stored_model(cfg, overrides, entry)  # test.py's checks and loading
    if is_quantized_state(read_checkpoint(path)[0]) and not allow_quantized:
        raise ConfigError(f"{path} is already quantised; pass the float checkpoint it came from.")
    return model.eval(), cfg, path
