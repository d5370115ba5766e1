"""The adder convolution: module, functional form, reference and kernels."""
from .adder2d import Adder2d, adder2d

__all__ = ["Adder2d", "adder2d"]
