"""The integer network of a quantised CIFAR ResNet (addernet/quant/intnet.py, the integer kernel's network
entry): against a float64 reference of the quantised model written from the formulas, against the
layer-by-layer QAdder2d model, over batch and thread splits, 8/4/12 bits (uint8 and uint16 lanes), groups
with different scales; load_quantized(path); the official checkpoint on sample images."""

import pytest
import torch

from addernet.engine import ConfigError
from addernet.models import build_model
from addernet.quant import IntegerResNet, QAdder2d, inference_model, load_quantized, quantize_model, save_quantized

from helpers import (
    CIFAR_SAMPLE,
    OFFICIAL_R20,
    SHARED,
    max_rel_error,
    needs_shared,
    quant_cfg,
    quantised_reference,
    quantised_resnet20,
    random_images,
)


@pytest.fixture(scope="module", params=[(8, "unsigned"), (4, "unsigned"), (12, "unsigned"), (4, "signed")])
def quantised(request):
    return quantised_resnet20(*request.param)


def test_groups_of_the_test_model_have_different_scales(quantised):
    """The multi-plane path (one plane per scale, one call) is exercised: some layer has several scales."""
    assert max(len(set(m.scale.tolist())) for m in quantised.modules() if isinstance(m, QAdder2d)) >= 3


def test_integer_network_equals_the_float64_reference_of_the_quantised_model(quantised):
    x = random_images(6, 2)
    net = IntegerResNet(quantised)
    assert net.lane == (torch.uint8 if int(quantised.layer1[0].conv1.bits) <= 8 else torch.uint16)
    ref = quantised_reference(quantised, x)
    got = net(x)
    assert max_rel_error(got, ref) < 3e-5, max_rel_error(
        got, ref
    )  # the same levels everywhere: float32 rounding in the tail only
    with torch.no_grad():
        layers = quantised(x)
    # the layer-by-layer model rounds in float32 before quantising: never closer to the exact values
    assert max_rel_error(got, ref) <= max_rel_error(layers, ref) + 1e-6
    assert (got.argmax(1) == layers.argmax(1)).float().mean() >= 5 / 6


def test_batch_and_thread_splits_give_identical_outputs(quantised):
    x = random_images(5, 3)
    net = IntegerResNet(quantised)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = net.features(x)  # images split across threads
        single = torch.cat([net.features(x[i : i + 1]) for i in range(5)])  # pixels of one image split
        torch.set_num_threads(1)
        serial = net.features(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(whole, single) and torch.equal(whole, serial)  # determinism on one machine, however split


def test_inference_model_and_runtime_choices(quantised):
    model, runtime = inference_model(quantised, "auto")
    assert isinstance(model, IntegerResNet) and runtime == "integer network"
    assert inference_model(quantised, "layers") == (quantised, "layers")
    float_model = build_model("resnet20").eval()
    assert inference_model(float_model, "auto") == (
        float_model,
        "layers (no integer network: its body layers are not quantised adder layers)",
    )
    for runtime, match in (
        ("integer", "quant.runtime=integer: no integer network here"),
        ("fast", "quant.runtime='fast'"),
    ):
        with pytest.raises(ConfigError, match=match) as e:
            inference_model(float_model, runtime)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="not quantised adder layers"):
        IntegerResNet(float_model)
    with pytest.raises(RuntimeError, match="inference only"):
        IntegerResNet(quantised).train()


def test_load_quantized_returns_the_integer_network(tmp_path):
    model = quantised_resnet20(8)
    path = save_quantized(
        tmp_path / "q8.pt",
        model,
        {"model": {"name": "resnet20", "layer": "adder"}, "data": {"num_classes": 10, "in_channels": 3}},
        {"bits": 8},
    )
    x = random_images(4, 4)
    net = load_quantized(path)
    assert isinstance(net, IntegerResNet) and not net.training
    assert torch.equal(net(x), IntegerResNet(model)(x))  # determinism: the same network rebuilt from its file
    layers = load_quantized(path, runtime="layers")
    assert isinstance(layers.layer1[0].conv1, QAdder2d)
    with torch.no_grad():
        assert torch.equal(layers(x), model(x))


@pytest.mark.slow
@needs_shared("official/ResNet20-AdderNet.pth", "cifar10-test-sample", "cifar10-jpeg/train")
def test_official_resnet20_same_top1_as_the_layer_model_on_sample_images():
    """8 bits, calibrated on 256 training images; 300 sample images (30 per class): at most 1% of the images
    apart in the number correct from the QAdder2d model, the same prediction on at least 98% of them."""
    from torchvision.datasets import ImageFolder

    from addernet.checkpoint import load_checkpoint
    from addernet.checkpoint.official import load_official
    from addernet.data.transforms import build_transform

    from helpers import compose

    cfg = compose(["model=resnet20", "data=cifar10_folder", f"data.root={SHARED / 'cifar10-jpeg'}"], "test")
    tf = build_transform(cfg.data, "val")
    train = ImageFolder(str(SHARED / "cifar10-jpeg" / "train"), tf)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    calib = torch.stack([train[i][0] for i in order[:256]])
    sample = ImageFolder(str(CIFAR_SAMPLE), tf)
    pick = [i for i, (_, y) in enumerate(sample.samples) if sum(1 for _, z in sample.samples[:i] if z == y) < 30]
    x = torch.stack([sample[i][0] for i in pick])
    y = torch.tensor([sample.samples[i][1] for i in pick])
    model = build_model("resnet20")
    load_official(model, load_checkpoint(OFFICIAL_R20))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(calib, torch.zeros(256)), batch_size=128)
    quantize_model(model.eval(), loader, quant_cfg(bits=8))
    with torch.no_grad():
        layers = model(x).argmax(1)
    net = IntegerResNet(model)(x).argmax(1)
    print(
        f"correct: integer network {int((net == y).sum())}, layers {int((layers == y).sum())}; "
        f"same prediction {int((net == layers).sum())} of {len(y)}"
    )
    # the two differ only where the layers' float32 rounding moves a level (see the float64 test above)
    assert abs(int((net == y).sum()) - int((layers == y).sum())) <= 3
    assert (net == layers).float().mean() >= 0.98
