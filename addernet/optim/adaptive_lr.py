"""Adaptive learning rate of AdderNet (Eq. 12-13) as an optimizer-step hook.

Each adder layer's weight gradient G is replaced by alpha * G with
alpha = eta * sqrt(k) / max(||G||_2, 1e-12), k = G.numel(). The official code does this inside
the layer's backward, once per call; here it runs once per optimizer step on the layer's TOTAL
gradient (summed over every use of the layer, every accumulated micro-batch and, under DDP,
after the all-reduce), so weight sharing, gradient accumulation and multi-GPU are right.
"""

import math
import numbers

import torch
import torch.nn as nn

from ..ops import ADDER_MODULES

_EPS = 1e-12  # the official code's clamp on the norm: keeps a zero gradient zero


class AdaptiveLR:
    """Normalises every Adder2d and AdderLinear weight gradient to norm eta * sqrt(k) right before the step.

    Usage: ``AdaptiveLR(model, eta).attach(optimizer)`` once, or call ``.apply()`` yourself
    between backward and step. With a GradScaler the hook runs after ``unscale_`` and not at all
    on a skipped (inf/nan) step; fused optimizers, which get scaled gradients and skip inside
    step(), are handled through ``optimizer.grad_scale``. Only the weights of ``Adder2d`` and
    ``AdderLinear`` are touched.
    """

    def __init__(self, model, eta=0.2):
        if not isinstance(model, nn.Module):
            raise TypeError(f"AdaptiveLR needs the model (an nn.Module), got {type(model).__name__}.")
        if isinstance(eta, bool) or not isinstance(eta, numbers.Real) or not math.isfinite(eta) or eta <= 0:
            raise ValueError(
                f"AdaptiveLR: eta must be a finite number > 0 (the paper and the official "
                f"code use 0.2; set adaptive_lr.eta), got {eta!r}."
            )
        self.eta = float(eta)
        # Unwrap DDP / DataParallel / torch.compile so names are the same however the model runs.
        while True:
            if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
                model = model.module
            elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
                model = model._orig_mod
            else:
                break
        self._layers, seen = [], set()  # (name, weight); a weight shared by two modules counts once
        for name, module in model.named_modules():
            if isinstance(module, ADDER_MODULES) and id(module.weight) not in seen:
                seen.add(id(module.weight))
                self._layers.append((name, module.weight))
        self._handles = []
        self._last = ([], [], [])  # (names, alpha tensors, norms) of the last application, read lazily

    @property
    def names(self):
        """Names of the adder layers found (module names without a DDP/compile wrapper prefix)."""
        return [name for name, _ in self._layers]

    @property
    def weights(self):
        """The adder weights it normalises (each once)."""
        return [weight for _, weight in self._layers]

    def attach(self, optimizer):
        """Apply before every ``optimizer.step()`` to the adder weights this optimizer updates."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"AdaptiveLR.attach needs a torch.optim.Optimizer, got {type(optimizer).__name__}.")

        def hook(opt, args, kwargs):
            owned = {id(p) for group in opt.param_groups for p in group["params"]}
            # GradScaler sets opt.grad_scale only for optimizers that unscale inside step()
            # (fused=True); their grads are still scaled here and step() divides by it.
            self._scale([(n, p) for n, p in self._layers if id(p) in owned], getattr(opt, "grad_scale", None))

        self._handles.append(optimizer.register_step_pre_hook(hook))
        return self

    def detach(self):
        """Remove the hooks installed by ``attach``."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def apply(self):
        """Scale the current adder gradients now; returns ``{layer_name: alpha}``.

        Call it on unscaled gradients: with a GradScaler, ``scaler.unscale_(optimizer)`` first."""
        self._scale(self._layers)
        return self.alphas

    @property
    def alphas(self):
        """``{layer_name: alpha}`` of the last application (one device sync, on read only).

        A layer whose gradient was exactly zero reports 0 (its update is 0 whatever alpha is), not
        the clamp's eta*sqrt(k)/1e-12, which would be a meaningless spike in the logged curves."""
        names, alphas, norms = self._last
        if not alphas:
            return {}
        alphas = torch.stack([a.to(alphas[0]) for a in alphas])
        norms = torch.stack([n.to(alphas) for n in norms])
        return dict(zip(names, torch.where(norms > 0, alphas, 0).tolist()))

    def _scale(self, layers, grad_scale=None):
        layers = [(n, p) for n, p in layers if p.requires_grad and p.grad is not None]
        grads = [p.grad for _, p in layers]
        if not grads:
            self._last = ([], [], [])
            return
        # All on device, no sync: norms in one foreach call, in >= float32 so that tiny
        # half-precision norms neither underflow the clamp nor overflow alpha.
        norms = [n if n.dtype in (torch.float32, torch.float64) else n.float() for n in torch._foreach_norm(grads)]
        alphas = torch._foreach_reciprocal(torch._foreach_clamp_min(norms, _EPS))
        torch._foreach_mul_(alphas, [self.eta * math.sqrt(g.numel()) for g in grads])
        if grad_scale is not None:  # G = s * true G: keep norm s * eta * sqrt(k), alpha stays true
            torch._foreach_mul_(alphas, grad_scale)
        same = [(g, a) for g, a in zip(grads, alphas) if g.dtype == a.dtype]
        if same:
            torch._foreach_mul_([g for g, _ in same], [a for _, a in same])
        for g, a in zip(grads, alphas):
            if g.dtype != a.dtype:  # half/bfloat16 gradient: multiply in float32, round once
                g.copy_(g.float().mul_(a))
        self._last = ([n for n, _ in layers], alphas, norms)
