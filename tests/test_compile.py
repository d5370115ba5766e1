"""trainer.compile (addernet/compile.py): a compiled CIFAR ResNet AdderNet computes what the eager one does.

The network is the ResNet-20 of the paper at depth 8 (one basic block per stage instead of three): every kind
of layer and connection ResNet-20 has (stem convolution, adder layers, identity and strided adder shortcuts,
BatchNorm in training mode, pooling, the classifier) in a graph of 7 adder layers instead of 19, which inductor
compiles much faster.

float64, so that equality is tested to 1e-9 rather than to float32 rounding: in float32 the compiled
BatchNorm reductions round differently and a ReLU input near 0 can flip, which moves single gradient
entries by ~1e-3 of the largest one (legitimately). aot_eager checks graph capture and AOT autograd
around the adder custom ops; inductor (C++ codegen on CPU, Triton on a GPU) is what trainer.compile uses.
"""

import copy
import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F

from addernet import AdaptiveLR
from addernet.compile import adder_graph_break, compile_model
from addernet.models import build_model
from addernet.models.resnet_cifar import CifarResNet


def _step(model, x, target):
    model.zero_grad(set_to_none=True)
    logits = model(x).flatten(1)
    F.cross_entropy(logits, target).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_cifar_resnet_matches_eager(monkeypatch, backend):
    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = CifarResNet(8, layer="adder").double().train()
    compiled = copy.deepcopy(eager)
    keys = list(eager.state_dict())
    assert compile_model(compiled, True, backend=backend, fullgraph=True) is compiled
    x, target = torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (4,))

    for _ in range(2):  # the second call runs the cached graph; BN running stats move twice in both
        want_logits, want_grads = _step(eager, x, target)
        logits, grads = _step(compiled, x, target)
        torch.testing.assert_close(logits, want_logits, rtol=1e-9, atol=1e-9)
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want_grads[name], rtol=1e-9, atol=1e-9, msg=name)
    for (name, p), q in zip(compiled.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9, msg=name)  # BN running stats updated alike
    # in place: same class, same state_dict keys (checkpoints interchangeable), same adder layers for AdaptiveLR
    assert type(compiled) is type(eager) and list(compiled.state_dict()) == keys
    assert AdaptiveLR(compiled).names == AdaptiveLR(eager).names
    torch._dynamo.reset()


def test_compile_off_leaves_the_model_alone():
    model = build_model("resnet20", layer="conv")
    forward = model.forward
    assert compile_model(model, False) is model and model.forward == forward
    assert getattr(model, "_compiled_call_impl", None) is None


def test_train_py_compiles_the_model_when_asked(tmp_path, monkeypatch):
    """trainer.compile=true reaches nn.Module.compile of the training model (recorded, not run: the
    numerics of a compiled model are the tests above)."""
    from addernet.engine import train

    from helpers import TINY_LENET, compose

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(type(self).__name__))
    base = [*TINY_LENET, "data.in_channels=1", "data.mean=[0.5]", "data.std=[0.5]", "trainer.epochs=1"]
    train(compose(base), str(tmp_path / "off"))
    assert compiled == []
    train(compose(base + ["trainer.compile=true"]), str(tmp_path / "on"))
    assert compiled == ["LeNet5BN"]


def test_compile_warns_when_this_torch_breaks_the_graph_at_every_adder_layer(monkeypatch):
    """A torch whose compiler cannot trace the adder call's backend lookup splits the graph at each adder layer
    (torch 2.11 on a GPU: recompile-limit warnings and a slower training); compile_model says so. Simulated by a
    graph break in that lookup; with this torch the call traces whole and nothing is said."""
    module = importlib.import_module("addernet.ops.adder2d")  # the module: addernet.ops.adder2d is the function
    lookup = module._backend

    def lookup_with_a_break():
        torch._dynamo.graph_break()
        return lookup()

    torch._dynamo.reset()
    assert adder_graph_break() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_model(build_model("resnet20"), True)
    monkeypatch.setattr(module, "_backend", lookup_with_a_break)
    torch._dynamo.reset()
    assert "graph_break" in adder_graph_break()
    with pytest.warns(RuntimeWarning, match="breaks the graph at every adder layer .*trainer.compile off"):
        compile_model(build_model("resnet20"), True)
    with warnings.catch_warnings():  # the CNN twin has no adder layer to break at
        warnings.simplefilter("error")
        compile_model(build_model("resnet20", layer="conv"), True)
    torch._dynamo.reset()
