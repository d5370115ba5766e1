"""Post-training quantisation of adder layers (AdderQuant-style; docs/quantization.md).

quantizer (the formulas), grouping (filters by max |w|), calibration (activation ranges, BatchNorm),
qadder (the quantised layer: integer or float path), convert (quantize_model), format (checkpoints),
cli (what test.py and the scripts call), onnx (export with standard operators), intnet (the
integer network: integer activations between adder layers, one kernel call), inference
(load_quantized(path): the module to run a quantised checkpoint with).
"""

from .cli import calibration_loader, quantize_for_eval
from .convert import check_quant_config, check_quant_settings, prepare_quantized, quant_summary, quantize_model
from .format import is_quantized_state, load_quantized_into, save_quantized
from .inference import inference_model, load_quantized
from .intnet import IntegerResNet
from .qadder import QAdder2d

__all__ = [
    "IntegerResNet",
    "QAdder2d",
    "calibration_loader",
    "check_quant_config",
    "check_quant_settings",
    "inference_model",
    "is_quantized_state",
    "load_quantized",
    "load_quantized_into",
    "prepare_quantized",
    "quant_summary",
    "quantize_for_eval",
    "quantize_model",
    "save_quantized",
]
