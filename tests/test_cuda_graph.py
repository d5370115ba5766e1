"""trainer.cuda_graph (addernet/cuda_graph.py): graphed training follows eager training step for step; a batch of
another shape, evaluation and a model with hooks are handled as the docs say; the config rules refuse what a graph
cannot do. The replay tests need a CUDA GPU (marker ``cuda``, run by scripts/gpu_check.sh)."""

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from addernet import AdaptiveLR
from addernet.cuda_graph import CudaGraphed
from addernet.engine import config as engine_config
from addernet.engine import train
from addernet.errors import ConfigError
from addernet.models import build_model

from helpers import FAKE, compose


def cuda(test):
    """Marker ``cuda`` (selected by scripts/gpu_check.sh) plus a skip without a GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def test_needs_a_cuda_device(cfg_train):
    cfg_train.trainer.device = "cpu"
    cfg_train.trainer.cuda_graph = True
    with pytest.raises(ConfigError, match=r"trainer.cuda_graph=true needs a CUDA device \(trainer.device=cuda\)"):
        engine_config.check_config(cfg_train)


@pytest.mark.parametrize(
    "change, world, message",
    [
        ({}, 2, r"runs in one process, not under torchrun \(2\)"),
        ({"compile": True}, 1, r"trainer.cuda_graph=true and trainer.compile=true do not combine"),
        ({"accumulate": 2}, 1, r"needs trainer.accumulate=1 \(got 2\)"),
    ],
)
def test_refuses_what_a_graph_cannot_do(cfg_train, monkeypatch, change, world, message):
    monkeypatch.setattr(engine_config, "device_type", lambda cfg: "cuda")  # the rule, on a machine without a GPU
    cfg_train.trainer.cuda_graph = True
    for key, value in change.items():
        cfg_train.trainer[key] = value
    with pytest.raises(ConfigError, match=message):
        engine_config.check_cuda_graph(cfg_train, world)


def test_refuses_a_model_with_hooks():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    model[1].register_forward_hook(lambda m, i, o: None)  # a hook a replay would skip
    message = r"cannot record the Python hooks on 1, which a replay would skip .*trainer.cuda_graph=false"
    with pytest.raises(ConfigError, match=message):
        CudaGraphed(model)


def _resnet(seed=0):
    torch.manual_seed(seed)
    model = build_model("resnet20", layer="adder").cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    AdaptiveLR(model, 0.2).attach(opt)
    return model, opt


def _train(forward, model, opt, batches):
    losses = []
    for x, t in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(x), t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@cuda
def test_graphed_training_follows_eager(monkeypatch):
    """Four SGD steps with the adaptive LR: the same losses, weights and BatchNorm statistics as without graphs (so
    recording left the BatchNorm statistics as they were), to float32 rounding."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    batches = [
        (torch.randn(32, 3, 32, 32, device="cuda", generator=gen), torch.randint(0, 10, (32,), device="cuda"))
        for _ in range(4)
    ]
    eager, eager_opt = _resnet()
    graphed, graphed_opt = _resnet()
    expected = _train(eager, eager, eager_opt, batches)
    got = _train(CudaGraphed(graphed), graphed, graphed_opt, batches)
    assert got == pytest.approx(expected, rel=1e-4)
    for (name, a), b in zip(eager.state_dict().items(), graphed.state_dict().values()):
        if a.is_floating_point():
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
        else:
            assert torch.equal(a, b), name  # num_batches_tracked: 4 steps, no extra ones from recording


@cuda
def test_other_batches_run_the_model():
    """A batch of another size (an epoch's last) and evaluation run the model itself, not the recorded graph."""
    model, _ = _resnet()
    run = CudaGraphed(model)
    run(torch.randn(16, 3, 32, 32, device="cuda"))  # records on 16 images
    x = torch.randn(6, 3, 32, 32, device="cuda")
    reference = copy.deepcopy(model)
    torch.testing.assert_close(run(x), reference(x), rtol=1e-5, atol=1e-4)
    model.eval(), reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(run(x), reference(x), rtol=1e-5, atol=1e-4)


@cuda
def test_train_py_with_cuda_graph(tmp_path):
    """A tiny run with trainer.cuda_graph=true, whose epochs end on a smaller batch, against the same run without."""
    records = {}
    for graph in ("false", "true"):
        overrides = ["trainer.device=cuda", f"trainer.cuda_graph={graph}", "data.train_size=40", "trainer.epochs=2"]
        run = tmp_path / graph
        train(compose(FAKE + overrides), str(run))
        records[graph] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert json.loads((run / "run.json").read_text())["cuda_graph"] == (graph == "true")
    for a, b in zip(records["false"], records["true"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-3)


def test_evaluates_as_the_model(cfg_train):
    """The engine evaluates the model through the wrapper (as through DDP): the same figures as the bare model, and
    the model back in training mode after."""
    from addernet.data import build_dataset, build_loader
    from addernet.engine.evaluation import evaluate
    from addernet.models import model_from_config

    torch.manual_seed(0)
    model = model_from_config(cfg_train)
    loader = build_loader(cfg_train.data, "val", build_dataset(cfg_train.data, "val"))
    wrapped = CudaGraphed(model)
    got, expected = evaluate(wrapped, loader, torch.device("cpu")), evaluate(model, loader, torch.device("cpu"))
    assert (got["top1"], got["loss"], got["n"]) == (expected["top1"], expected["loss"], expected["n"])
    assert model.training and wrapped.training


def test_the_engine_replays_full_batches_and_leaves_training_as_it_was(tmp_path, monkeypatch):
    """The engine's graphed path on CPU, with a stand-in for make_graphed_callables that runs the recorder's three
    warm-up passes (which move the BatchNorm statistics) and returns the module, counting its calls: the two full
    batches of each epoch go through the recorded callable, the smaller last one through the model, and the run's
    figures are exactly the eager run's (so recording left the BatchNorm statistics as they were)."""
    recorded, replays = [], []

    def stand_in(module, sample_args):
        params = [p for p in module.parameters() if p.requires_grad]
        for _ in range(3):
            torch.autograd.grad(module(*sample_args).sum(), params)
        recorded.append(tuple(sample_args[0].shape))

        def replay(x):
            replays.append(tuple(x.shape))
            return module(x)

        return replay

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", stand_in)
    monkeypatch.setattr(CudaGraphed, "device_type", "cpu")
    monkeypatch.setattr(engine_config, "check_cuda_graph", lambda cfg, world: None)
    records = {}
    for graph in ("false", "true"):
        run = tmp_path / graph
        train(compose(FAKE + [f"trainer.cuda_graph={graph}", "data.train_size=40", "trainer.epochs=2"]), str(run))
        records[graph] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert recorded == [(16, 3, 28, 28)]
    assert replays == [(16, 3, 28, 28)] * 4  # 2 epochs x 2 full batches of 16; the batches of 8 ran the model
    keys = ("train_loss", "train_top1", "val_loss", "val_top1")
    assert [[r[k] for k in keys] for r in records["true"]] == [[r[k] for k in keys] for r in records["false"]]
    eager, graphed = (torch.load(tmp_path / g / "checkpoints" / "last.pt", weights_only=True)["model"] for g in records)
    for name, value in eager.items():  # weights and BatchNorm statistics; num_batches_tracked counts 6 steps in both
        assert torch.equal(graphed[name], value), name
