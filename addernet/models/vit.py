"""A small vision transformer (``model=vit``): adder form (AdderLinear and adder attention) and its twin.

    patches: Conv2d(in, width, patch_size, stride=patch_size) + learned position embedding  (multiplicative)
    depth x  x = x + Attention(LN(x));  x = x + MLP(LN(x))                                    (pre-norm blocks)
    head:    LN, mean over the tokens, nn.Linear(width, num_classes)                          (multiplicative)

layer="adder": AdderAttention with the given switches (attention.py) and an MLP of AdderLinear layers, each
followed by a LayerNorm (mlp="linear" keeps the MLP multiplicative). layer="conv": the ordinary ViT with the
same sizes (dot-product attention, nn.Linear projections and MLP, no identity, no extra norms); the
attention switches are then ignored. Patch and classifier stay multiplicative in both, as the paper keeps the
first convolution and the classifier of its CNNs. Sizes and the choices that are ours: docs/any_network.md.
"""

import math

import torch
import torch.nn as nn

from ..config.schema import ViTModel as S
from ..errors import ConfigError
from .attention import AdderAttention, projection
from .registry import register_model


class Block(nn.Module):
    """Pre-norm transformer block; two residual sums."""

    def __init__(self, width, heads, mlp_ratio, attention, mlp):
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = AdderAttention(width, heads, **attention)
        self.mlp = nn.Sequential(projection(width, hidden, mlp), nn.GELU(), projection(hidden, width, mlp))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(
        self, num_classes, in_channels, image_size, patch_size, width, depth, heads, mlp_ratio, attention, mlp
    ):
        super().__init__()
        self.patch = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2, width))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*(Block(width, heads, mlp_ratio, attention, mlp) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)  # B, N, width
        if x.shape[1] != self.pos.shape[1]:
            side = math.isqrt(self.pos.shape[1]) * self.patch.stride[0]
            raise ConfigError(
                f"model=vit was built for {side}x{side} images ({self.pos.shape[1]} patches, model.image_size="
                f"{side}) but got {images.shape[-2]}x{images.shape[-1]} images ({x.shape[1]} patches); set "
                "model.image_size to the data's image size (data.image_size)"
            )
        x = self.blocks(x + self.pos)
        return self.head(self.norm(x).mean(1))


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"model.{name} must be a positive integer, got {v!r}")


@register_model("vit")
def vit(
    layer=S.layer,
    num_classes=10,
    in_channels=3,
    image_size=32,
    patch_size=S.patch_size,
    width=S.width,
    depth=S.depth,
    heads=S.heads,
    mlp_ratio=S.mlp_ratio,
    scores=S.scores,
    tau=S.tau,
    identity=S.identity,
    value=S.value,
    key_grad=S.key_grad,
    proj=S.proj,
    mlp=S.mlp,
):
    """The ViT of this module; see the module docstring for what `layer` and the switches select (their defaults:
    the model=vit schema's, addernet/config/schema.py; image_size: the data's in a run, 32 here)."""
    for name, v in (
        ("image_size", image_size),
        ("patch_size", patch_size),
        ("width", width),
        ("depth", depth),
        ("heads", heads),
    ):
        _positive(name, v)
    if image_size % patch_size:
        raise ValueError(
            f"model.patch_size={patch_size} must divide the image size {image_size} "
            "(e.g. patch_size=4 or 7 for 28x28, 4 or 8 for 32x32)"
        )
    if width % heads:
        raise ValueError(f"model.heads={heads} must divide model.width={width}")
    if not mlp_ratio > 0:
        raise ValueError(f"model.mlp_ratio must be > 0, got {mlp_ratio!r}")
    if layer == "adder":
        attention = dict(scores=scores, tau=tau, identity=identity, value=value, key_grad=key_grad, proj=proj)
    elif layer == "conv":
        attention, mlp = dict(scores="dot", identity="none", value="product", proj="linear"), "linear"
    else:
        raise ValueError(f"unknown layer {layer!r}: use model.layer=adder or model.layer=conv")
    return ViT(num_classes, in_channels, image_size, patch_size, width, depth, heads, float(mlp_ratio), attention, mlp)
