"""Categories of a training step's time: which profiler event belongs to the adder kernels, BatchNorm, ...

scripts/profile_step.py prints each category's share of a ResNet-20 or ViT step, the adder model against its
twin. In the ViT the adder convolution's ops are AdderLinear's, apart from those inside ``l1_scores`` (the
profile script labels its forward L1_SCORES; its backward is autograd's L1ScoresBackward node).
"""

L1_SCORES = "l1_scores"

CATEGORIES = (
    "l1_scores forward: kernel",
    "l1_scores forward: layout copies",
    "l1_scores backward: kernel",
    "l1_scores backward: layout copies",
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
    "matmul (linear, attention)",
    "LayerNorm forward",
    "LayerNorm backward",
    "softmax forward",
    "softmax backward",
    "GELU",
    "copies (layout, contiguous)",
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
    # inside l1_scores (no autograd wrapper) the forward kernel runs as the op's own event
    kernel = own in (
        "addernet::adder2d_forward",
        "addernet::adder2d_grad_input",
        "addernet::adder2d_grad_input_weight",
        "L1ScoresCPU",  # the CPU kernel with a weight per image: its forward (the kernel call) and its ops
        "addernet::l1_scores_cpu",
        "addernet::l1_scores_grad_cpu",
    )
    for n in names:
        if n == L1_SCORES:
            return f"l1_scores forward: {'kernel' if kernel else 'layout copies'}"
        if n.startswith("L1Scores") and n.endswith("Backward"):
            return f"l1_scores backward: {'kernel' if kernel else 'layout copies'}"
    for i, n in enumerate(names):
        # the custom op's CPU kernel runs as an event named after its autograd wrapper
        if n == "GeneratedBackwardFor_addernet_adder2d_forward_default":
            return "adder forward: kernel" if i == 0 else "adder forward: packing/copies"
        if n == "addernet::adder2d_forward":  # the op's own dispatch time
            return "adder forward: packing/copies"
        if n == "addernet::adder2d_grad_input":
            return "adder input-grad: kernel" if i == 0 else "adder input-grad: packing/copies"
        if n == "addernet::adder2d_grad_input_weight":  # the input gradient, which also sums g*X for the weight's
            if any(a in ("aten::convolution_backward", "aten::bmm") for a in names[:i]):  # a weight too large for it
                return "adder weight-grad"
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
    if own in ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"):
        return "matmul (linear, attention)"
    if own in ("aten::native_layer_norm", "aten::native_layer_norm_backward"):
        return "LayerNorm " + ("backward" if own.endswith("backward") else "forward")
    if own in ("aten::_softmax", "aten::_softmax_backward_data"):
        return "softmax " + ("backward" if own.endswith("data") else "forward")
    if own in ("aten::gelu", "aten::gelu_backward"):
        return "GELU"
    if own in ("aten::copy_", "aten::clone", "aten::contiguous"):
        return "copies (layout, contiguous)"
    return "other"
