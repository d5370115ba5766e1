"""trainer.cuda_graph: the model's training forward and backward replayed as CUDA graphs.

On a GPU the adder layers launch several small kernels each and their Python wrapper costs more host time than the
kernels take: a ResNet-20 step at batch 256 spent 45 ms launching work that kept an H200 busy for 12 ms
(docs/gpu.md). ``torch.cuda.make_graphed_callables`` records the forward and the backward once and replays each
with one launch, so a step takes the GPU's time, not the host's.

A graph replays what it recorded for one input shape, layout and dtype, one autocast state, the module in training
mode. ``CudaGraphed`` records on the first training batch and replays for batches that match it; anything else (a
smaller last batch, evaluation, precise BatchNorm under no_grad) runs the model as usual, on the same parameters.
The outputs of a replay live in the graph's memory and are overwritten by the next replay: the step uses them
before the next batch. What a graph cannot replay is refused when it is built: Python hooks on the model's modules
(a task's feature taps), a model run by torchrun's DDP or torch.compile.
"""

import torch
import torch.nn as nn

from .errors import ConfigError


class _Forward(nn.Module):
    """The model behind a module of its own: make_graphed_callables replaces this module's forward, not the
    model's, so the model keeps its class, its forward and its state_dict keys."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)


def hooked_modules(model):
    """Names of the model's modules with forward or backward hooks, which a replayed graph would not call."""
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    named = model.named_modules()
    return [name or type(model).__name__ for name, m in named if any(getattr(m, h, None) for h in hooks)]


class CudaGraphed(nn.Module):
    """``CudaGraphed(model)(x)``: the model's training forward, replayed from a CUDA graph where ``x`` matches the
    batch it was recorded on, else the model itself. A wrapper as DDP is one: ``train()`` / ``eval()`` reach the
    model, and the model's state_dict stays the model's own."""

    def __init__(self, model):
        hooked = hooked_modules(model)
        if hooked:
            raise ConfigError(
                f"trainer.cuda_graph=true cannot record the Python hooks on {', '.join(hooked[:3])}"
                f"{' ...' if len(hooked) > 3 else ''}, which a replay would skip (task=pkkd's feature taps, a "
                "torchvision ViT's input-size check); use trainer.cuda_graph=false for this run."
            )
        super().__init__()
        self.model, self.graphed, self.key = model, None, None

    #: the device whose batches are recorded and replayed (tests run the logic on CPU with a stand-in recorder)
    device_type = "cuda"

    @staticmethod
    def _key(x):
        device = x.device.type
        amp = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        return tuple(x.shape), x.stride(), x.dtype, x.device, amp

    def forward(self, x):
        replays = x.device.type == self.device_type and not x.requires_grad
        if not (replays and self.model.training and torch.is_grad_enabled()):
            return self.model(x)
        if self.graphed is None:
            self.graphed, self.key = self._record(x), self._key(x)
        return self.graphed(x) if self._key(x) == self.key else self.model(x)

    def _record(self, x):
        """Record the graphs on ``x``. make_graphed_callables runs the model a few times first; its BatchNorm
        statistics and other buffers are put back afterwards, so recording leaves the model as it was."""
        buffers = [b.detach().clone() for b in self.model.buffers()]
        device = x.device.type
        amp = {"dtype": torch.get_autocast_dtype(device), "enabled": torch.is_autocast_enabled(device)}
        # autocast's weight-cast cache would hand the graph tensors cast before it was recorded
        with torch.autocast(device, cache_enabled=False, **amp):
            try:
                graphed = torch.cuda.make_graphed_callables(_Forward(self.model), (x.detach().clone(),))
            except RuntimeError as e:
                raise ConfigError(
                    f"trainer.cuda_graph=true: the model's training step cannot be recorded as a CUDA graph "
                    f"({str(e).strip().splitlines()[0]}); use trainer.cuda_graph=false for this model."
                ) from e
        with torch.no_grad():
            for b, saved in zip(self.model.buffers(), buffers):
                b.copy_(saved)
        return graphed
