"""trainer.compile: torch.compile of the model, in place.

In place (nn.Module.compile) rather than ``torch.compile(model)``: the module keeps its class, its
named_modules and its state_dict keys (no ``_orig_mod.`` prefix), so checkpoints, AdaptiveLR and the
TensorBoard histograms are the same with compile on or off. The adder ops are torch.library custom
ops with fake kernels (addernet/ops/adder2d.py): the compiler keeps them as opaque calls and
compiles what lies between them (BN, ReLU, additions, the stem and classifier convolutions).
"""

import logging

log = logging.getLogger("addernet.compile")


def compile_model(model, enabled, **options):
    """``model``, compiled in place with torch.compile ``options`` (e.g. backend=, mode=) when ``enabled``."""
    if enabled:
        model.compile(**options)
        log.info(
            "trainer.compile: %s compiled in place (torch.compile%s)",
            type(model).__name__,
            "".join(f", {k}={v!r}" for k, v in options.items()),
        )
    return model
