"""AdderNet: convolutions with the negative L1 distance (Chen et al., CVPR 2020)."""

from .models import AdderAttention, AdderizeReport, adderize
from .ops import Adder2d, AdderLinear, adder2d, adder_linear, l1_scores
from .optim import AdaptiveLR

__all__ = [
    "Adder2d",
    "AdderLinear",
    "AdderAttention",
    "AdderizeReport",
    "AdaptiveLR",
    "adder2d",
    "adder_linear",
    "adderize",
    "l1_scores",
]
