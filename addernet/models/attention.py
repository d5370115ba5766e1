"""Multi-head self-attention with adder scores (adder attention) and, with other switches, its ordinary twin.

    S_h = -||q_i - k_j||_1 / tau   (scores="l1", ops/attention.py: the adder kernels)   or   q_i . k_j / tau ("dot")
    A_h = softmax_j(S_h)
    O_h = A_h V_h (+ V_h with identity="add": the map A_h + I)                        (value="product")
        = -sum_j |A_ij - V_jc| (+ V_h)                                                 (value="adder")
    out = norm(W_o [O_1 .. O_H])

From "Adder Attention for Vision Transformer" (Shu et al., NeurIPS 2021) we take only what its abstract states:
scores from additions only, and an identity mapping against the rank collapse of such an attention map. Every
other choice here is ours (docs/any_network.md): the default tau = sqrt(head_dim), the identity added to the
map as A + I (so O = A V + V), the projections as AdderLinear layers each followed by a LayerNorm (an adder
output is large and negative; proj="linear" uses nn.Linear without it), A V kept a product, and the keys'
gradient HardTanh(q - k) (key_grad="hardtanh"; "full" gives them the adder-weight gradient q - k).
With scores="dot", identity="none", proj="linear" this is ordinary multi-head self-attention.
"""

import math

import torch
import torch.nn as nn

from ..ops import AdderLinear, l1_scores
from ..ops.attention import KEY_GRADS

SCORES, IDENTITY, VALUES, PROJ = ("l1", "dot"), ("add", "none"), ("product", "adder"), ("adder", "linear")


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"AdderAttention {name}={value!r} is not valid; use one of {', '.join(allowed)}")


def projection(dim_in, dim_out, kind):
    """AdderLinear followed by LayerNorm (kind="adder") or nn.Linear with bias (kind="linear", followed by an
    nn.Identity so that the weight layer has the same name, ``<proj>.0``, in both forms)."""
    _choice("proj", kind, PROJ)
    if kind == "adder":
        return nn.Sequential(AdderLinear(dim_in, dim_out), nn.LayerNorm(dim_out))
    return nn.Sequential(nn.Linear(dim_in, dim_out), nn.Identity())


class AdderAttention(nn.Module):
    """Self-attention over x (B, N, dim) -> (B, N, dim); the switches are the module docstring's."""

    def __init__(
        self, dim, heads=4, scores="l1", identity="add", value="product", proj="adder", tau=None, key_grad="hardtanh"
    ):
        super().__init__()
        for name, v, allowed in (
            ("scores", scores, SCORES),
            ("identity", identity, IDENTITY),
            ("value", value, VALUES),
            ("key_grad", key_grad, KEY_GRADS),
        ):
            _choice(name, v, allowed)
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or dim % heads:
            raise ValueError(f"AdderAttention heads={heads!r} must be a positive int dividing dim={dim}")
        if tau is not None and not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
            raise ValueError(f"AdderAttention tau={tau!r} must be a number > 0 (or None for sqrt(head_dim))")
        self.heads, self.head_dim = heads, dim // heads
        self.scores, self.identity, self.value, self.key_grad = scores, identity, value, key_grad
        self.tau = float(tau) if tau is not None else math.sqrt(self.head_dim)
        self.q, self.k, self.v = (projection(dim, dim, proj) for _ in range(3))
        self.out = projection(dim, dim, proj)

    def _split(self, t):
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # B, H, N, dh

    def attention_map(self, x):
        """A (B, H, N, N) = softmax of the scores, without the identity."""
        q, k = self._split(self.q(x)), self._split(self.k(x))
        s = l1_scores(q, k, self.key_grad) if self.scores == "l1" else q @ k.transpose(-1, -2)
        return torch.softmax(s / self.tau, dim=-1)

    def forward(self, x):
        a, v = self.attention_map(x), self._split(self.v(x))
        o = a @ v if self.value == "product" else l1_scores(a, v.transpose(-1, -2).contiguous(), self.key_grad)
        if self.identity == "add":
            o = o + v
        b, h, n, dh = o.shape
        return self.out(o.transpose(1, 2).reshape(b, n, h * dh))

    def extra_repr(self):
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, scores={self.scores}, tau={self.tau:g}, "
            f"identity={self.identity}, value={self.value}, key_grad={self.key_grad}"
        )
