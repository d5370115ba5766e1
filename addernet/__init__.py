"""AdderNet: convolutions with the negative L1 distance (Chen et al., CVPR 2020)."""
from .ops import Adder2d, adder2d

__all__ = ["Adder2d", "adder2d"]
