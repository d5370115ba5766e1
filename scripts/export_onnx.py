"""Export to ONNX: ``python scripts/export_onnx.py checkpoint=PATH out=model.onnx [quant.bits=8 ...] [opset=17]``.

The float model, or with quant.bits (or a quantised checkpoint of scripts/quantize.py) the quantised
one, written with standard operators only (addernet/quant/onnx.py), input "images" (N, C, H, W) with
a dynamic batch, output "logits"; onnx.checker runs on the file. Needs the optional extras onnx
(+ onnxruntime to run it): pip install -r requirements-extras.txt.
"""

import json

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf.errors import OmegaConfBaseException

from addernet.config.entry import run_entry
from addernet.engine.eval_run import load_float_model
from addernet.engine.output_path import check_output_path
from addernet.errors import reported
from addernet.quant import quantize_for_eval
from addernet.quant.onnx import export_onnx


def task(cfg):
    with reported("export_onnx.py", errors=(OmegaConfBaseException, ValueError, ImportError)):
        check_output_path(cfg.get("out"), "out", inputs=(cfg.get("checkpoint"),), overwrite=bool(cfg.overwrite))
        model, cfg, path = load_float_model(
            cfg, HydraConfig.get().overrides.task, allow_quantized=True, entry="export_onnx"
        )
        model, info = quantize_for_eval(model, cfg)
        size = int(cfg.data.image_size)
        example = torch.zeros(2, int(cfg.data.in_channels), size, size)
        export_onnx(model.eval(), cfg.out, example, int(cfg.opset))
        print(json.dumps({"out": str(cfg.out), "opset": int(cfg.opset), "quant": info}), flush=True)


def main():
    run_entry("export_onnx.py", "export_onnx", task)


if __name__ == "__main__":
    main()
