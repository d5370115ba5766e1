"""The adder convolution: module, functional form, reference and kernels; the adder linear layer and
the L1 attention scores built on the same kernels."""
from .adder2d import Adder2d, adder2d
from .attention import l1_scores
from .linear import AdderLinear, adder_linear

# modules whose .weight is an adder weight (full-precision gradient X - W, adaptive learning rate)
ADDER_MODULES = (Adder2d, AdderLinear)

__all__ = ["ADDER_MODULES", "Adder2d", "AdderLinear", "adder2d", "adder_linear", "l1_scores"]
