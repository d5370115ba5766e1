"""Categories of a training step's time: which profiler event belongs to the adder kernels, BatchNorm, ...

scripts/profile_step.py prints each category's share of a ResNet-20 step, AdderNet against its CNN twin.
"""

CATEGORIES = (
    "adder forward: kernel",
    "adder forward: packing/copies",
    "adder input-grad: kernel",
    "adder input-grad: packing/copies",
    "adder weight-grad",
    "conv forward",
    "conv backward",
    "BatchNorm forward",
    "BatchNorm backward",
    "ReLU forward",
    "ReLU backward",
    "adds (residual, grad accumulation)",
    "adaptive-LR hook",
    "optimizer (SGD)",
    "other",
)


def category(ev):
    """Category of a profiler event from its own name and its ancestors' names."""
    names, e = [], ev
    while e is not None:
        names.append(e.name)
        e = e.cpu_parent
    own = names[0]
    for i, n in enumerate(names):
        # the custom op's CPU kernel runs as an event named after its autograd wrapper
        if n == "GeneratedBackwardFor_addernet_adder2d_forward_default":
            return "adder forward: kernel" if i == 0 else "adder forward: packing/copies"
        if n == "addernet::adder2d_forward":  # the op's own dispatch time
            return "adder forward: packing/copies"
        if n == "addernet::adder2d_grad_input":
            return "adder input-grad: kernel" if i == 0 else "adder input-grad: packing/copies"
        if n.endswith("GeneratedBackwardFor_addernet_adder2d_forward_defaultBackward"):
            return "adder weight-grad"
        if n == "adaptive_lr":
            return "adaptive-LR hook"
        if n.startswith("Optimizer.step"):
            return "optimizer (SGD)"
    if own in ("aten::convolution_backward",):
        return "conv backward"
    if own in ("aten::mkldnn_convolution", "aten::_convolution", "aten::thnn_conv2d", "aten::_slow_conv2d_forward"):
        return "conv forward"
    if own == "aten::native_batch_norm":
        return "BatchNorm forward"
    if own == "aten::native_batch_norm_backward":
        return "BatchNorm backward"
    if own in ("aten::clamp_min_", "aten::relu_", "aten::relu"):
        return "ReLU forward"
    if own == "aten::threshold_backward":
        return "ReLU backward"
    if own in ("aten::add", "aten::add_"):
        return "adds (residual, grad accumulation)"
    return "other"
