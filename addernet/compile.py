"""trainer.compile: torch.compile of the model, in place.

In place (nn.Module.compile) rather than ``torch.compile(model)``: the module keeps its class, its
named_modules and its state_dict keys (no ``_orig_mod.`` prefix), so checkpoints, AdaptiveLR and the
TensorBoard histograms are the same with compile on or off. The adder ops are torch.library custom
ops with fake kernels (addernet/ops/adder2d.py): the compiler keeps them as opaque calls and
compiles what lies between them (BN, ReLU, additions, the stem and classifier convolutions).

An adder layer's call reads the backend chosen for the run (a ContextVar, addernet/ops/adder2d.py). A torch
whose compiler cannot trace that read (2.11 could not; the tested 2.14 can) breaks the graph at every adder
layer: each layer shape then compiles its own frame, and past the compiler's recompile limit (8) the rest run
uncompiled, slower than not compiling (docs/gpu.md). compile_model tries one adder call and warns when so.
"""

import logging
import warnings

import torch

from .ops.adder2d import AdderParameters, adder2d

log = logging.getLogger("addernet.compile")


def adder_graph_break():
    """None when torch.compile traces an adder layer's call in one graph with this torch, else the compiler's
    reason (its first line)."""
    x, w = torch.zeros(1, 1, 2, 2, device="meta"), torch.zeros(1, 1, 1, 1, device="meta")  # traced, no kernel run
    try:
        torch.compile(adder2d, backend="eager", fullgraph=True)(x, w)
    except Exception as e:  # torch._dynamo.exc.Unsupported and its kin: whatever stops a full graph
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


def compile_model(model, enabled, **options):
    """``model``, compiled in place with torch.compile ``options`` (e.g. backend=, mode=) when ``enabled``."""
    if enabled:
        if any(isinstance(m, AdderParameters) for m in model.modules()):
            reason = adder_graph_break()
            if reason is not None:
                warnings.warn(
                    f"trainer.compile: torch {torch.__version__} breaks the graph at every adder layer ({reason}), "
                    "so each layer shape compiles on its own and past the recompile limit runs uncompiled, slower "
                    "than trainer.compile=false; install the tested torch (requirements.txt) or leave "
                    "trainer.compile off",
                    RuntimeWarning,
                    stacklevel=2,
                )
        model.compile(**options)
        log.info(
            "trainer.compile: %s compiled in place (torch.compile%s)",
            type(model).__name__,
            "".join(f", {k}={v!r}" for k, v in options.items()),
        )
    return model
