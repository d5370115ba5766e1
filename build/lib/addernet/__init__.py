"""AdderNet: convolutions with the negative L1 distance (Chen et al., CVPR 2020)."""
from .ops import Adder2d, adder2d
from .optim import AdaptiveLR

__all__ = ["Adder2d", "adder2d", "AdaptiveLR"]
