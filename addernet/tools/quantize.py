"""Write a quantised checkpoint: ``python -m addernet.tools.quantize checkpoint=PATH out=PATH quant.bits=8 [quant.*=]``.

(``scripts/quantize.py`` is the same command.) Same settings as test.py (configs/quantize.yaml =
configs/test.yaml + ``out``): the model and data come from our checkpoint's stored config (or the
command line for official files); calibration runs on the data config's training split
(docs/quantization.md). The file (integer weights, scales, groups, bias terms, ranges, re-estimated
BatchNorm, the source config) is evaluated by test.py directly, without calibrating again, and loads
with torch.load(weights_only=True). Prints one JSON line.
"""

import json

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config.entry import run_entry
from ..engine import ConfigError
from ..engine.evaluation import load_float_model
from ..engine.rundir import check_output_path
from ..errors import reported
from ..quant import quantize_for_eval, save_quantized


def quantize(cfg, overrides):
    """Calibrate the checkpoint ``cfg`` names and write the quantised file; returns the printed settings."""
    check_output_path(cfg.get("out"), "out", inputs=(cfg.get("checkpoint"),), overwrite=bool(cfg.overwrite))
    model, cfg, path = load_float_model(cfg, overrides, entry="quantize")
    if cfg.quant.bits is None:
        raise ConfigError("give the bit width: quant.bits=8 (2..16)")
    model, info = quantize_for_eval(model, cfg)
    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("checkpoint", "out")}
    settings = {k: v for k, v in info.items() if k != "calibrated"}
    settings["source"] = str(path)
    save_quantized(cfg.out, model, config, settings)
    return {"out": str(cfg.out), **settings}


def task(cfg):
    with reported("quantize.py", errors=(OmegaConfBaseException,)):
        print(json.dumps(quantize(cfg, HydraConfig.get().overrides.task)), flush=True)


def cli():
    run_entry("quantize.py", "quantize", task)


if __name__ == "__main__":
    cli()
