"""Post-training quantisation of adder layers (AdderQuant-style; spec ../shared/specs/adderquant.md).

quantizer (the formulas), grouping (filters by max |w|), calibration (activation ranges, BatchNorm),
qadder (the quantised layer: integer or float path), convert (quantize_model), format (checkpoints),
cli (what test.py and the scripts call), onnx (export with standard operators).
"""
from .cli import calibration_loader, quantize_for_eval
from .convert import check_quant_config, prepare_quantized, quant_summary, quantize_model
from .format import is_quantized_state, load_quantized, save_quantized
from .qadder import QAdder2d

__all__ = ["QAdder2d", "calibration_loader", "check_quant_config", "is_quantized_state", "load_quantized",
           "prepare_quantized", "quant_summary", "quantize_for_eval", "quantize_model", "save_quantized"]
