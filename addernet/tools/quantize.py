"""Write a quantised checkpoint: ``python -m addernet.tools.quantize checkpoint=PATH out=PATH quant.bits=8 [quant.*=]``.

(``scripts/quantize.py`` is the same command.) Same settings as test.py (configs/quantize.yaml =
configs/test.yaml + ``out``): the model and data come from our checkpoint's stored config (or the
command line for official files); calibration runs on the data config's training split
(docs/quantization.md). The file (integer weights, scales, groups, bias terms, ranges, re-estimated
BatchNorm, the source config) is evaluated by test.py directly, without calibrating again, and loads
with torch.load(weights_only=True). Prints one JSON line.
"""

import json
import os

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config.entry import run_entry
from ..engine import ConfigError
from ..engine.evaluation import load_float_model
from ..engine.outputs import setup_logging
from ..engine.rundir import check_output_path
from ..errors import reported
from ..quant import check_quant_config, quantize_for_eval, save_quantized


def quantize(cfg, overrides):
    """Calibrate the checkpoint ``cfg`` names and write the quantised file; returns the printed settings.

    Everything the command line can get wrong (out=, quant.bits, every quant.* value) is checked first,
    before the checkpoint is read or any image is calibrated on."""
    if OmegaConf.is_missing(cfg, "out") or not cfg.out:
        raise ConfigError("no output file given: add out=PATH, the quantised checkpoint to write (e.g. out=q8.pt)")
    check_output_path(cfg.out, "out", inputs=(cfg.get("checkpoint"),), overwrite=bool(cfg.overwrite))
    check_writable(cfg.out)
    if cfg.quant.bits is None:
        raise ConfigError("give the bit width: quant.bits=8 (2..16)")
    check_quant_config(cfg.quant)
    model, cfg, path = load_float_model(cfg, overrides, entry="quantize")
    model, info = quantize_for_eval(model, cfg)
    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("checkpoint", "out")}
    settings = {k: v for k, v in info.items() if k != "calibrated"}
    settings["source"] = str(path)
    save_quantized(cfg.out, model, config, settings)
    return {"out": str(cfg.out), **settings}


def check_writable(out):
    """ConfigError now, before the calibration, when ``out`` cannot be written: the nearest existing folder on
    its path (the missing ones are created when the file is written) must be a writable directory."""
    folder = os.path.dirname(os.path.abspath(str(out)))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        why = "is not a folder" if not os.path.isdir(folder) else "is not writable"
        raise ConfigError(f"out={out} cannot be written: {folder} {why}; choose another path.")


def task(cfg):
    restore_logging = setup_logging(None, True)  # the calibration's stage lines, labelled [addernet.quant]
    try:
        with reported("quantize.py", errors=(OmegaConfBaseException,)):
            print(json.dumps(quantize(cfg, HydraConfig.get().overrides.task)), flush=True)
    finally:
        restore_logging()


def cli():
    run_entry("quantize.py", "quantize", task)


if __name__ == "__main__":
    cli()
