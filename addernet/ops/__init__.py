"""The adder convolution: module, functional form, reference and kernels; the adder linear layer and
the L1 attention scores built on the same kernels."""

from .adder2d import BACKENDS, Adder2d, adder2d, kernel_in_use, use_backend
from .attention import l1_scores
from .linear import AdderLinear, adder_linear

# modules whose .weight is an adder weight (full-precision gradient X - W, adaptive learning rate)
ADDER_MODULES = (Adder2d, AdderLinear)

__all__ = [
    "ADDER_MODULES",
    "BACKENDS",
    "Adder2d",
    "AdderLinear",
    "adder2d",
    "adder_linear",
    "kernel_in_use",
    "l1_scores",
    "use_backend",
]
