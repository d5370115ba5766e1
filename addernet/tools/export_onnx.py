"""Export to ONNX: ``python -m addernet.tools.export_onnx checkpoint=PATH out=model.onnx [quant.bits=8] [opset=17]``.

(``scripts/export_onnx.py`` is the same command.) The float model, or with quant.bits (or a quantised
checkpoint of scripts/quantize.py) the quantised one, written with standard operators only
(addernet/quant/onnx.py), input "images" (N, C, H, W) with a dynamic batch, output "logits";
onnx.checker runs on the file. Needs the optional extras onnx (+ onnxruntime to run it):
pip install -r requirements-extras.txt.
"""

import json

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf.errors import OmegaConfBaseException

from ..config.entry import run_entry
from ..engine.evaluation import load_float_model
from ..engine.rundir import check_output_path
from ..errors import reported
from ..quant import quantize_for_eval
from ..quant.onnx import export_onnx


def export(cfg, overrides):
    """Write the ONNX file ``cfg`` describes; returns the printed result."""
    check_output_path(cfg.get("out"), "out", inputs=(cfg.get("checkpoint"),), overwrite=bool(cfg.overwrite))
    model, cfg, _ = load_float_model(cfg, overrides, allow_quantized=True, entry="export_onnx")
    model, info = quantize_for_eval(model, cfg)
    size = int(cfg.data.image_size)
    example = torch.zeros(2, int(cfg.data.in_channels), size, size)
    export_onnx(model.eval(), cfg.out, example, int(cfg.opset))
    return {"out": str(cfg.out), "opset": int(cfg.opset), "quant": info}


def task(cfg):
    with reported("export_onnx.py", errors=(OmegaConfBaseException, ValueError, ImportError)):
        print(json.dumps(export(cfg, HydraConfig.get().overrides.task)), flush=True)


def cli():
    run_entry("export_onnx.py", "export_onnx", task)


if __name__ == "__main__":
    cli()
