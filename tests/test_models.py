"""The model zoo: structure, parameter counts, adder/conv twins, official checkpoint compatibility."""

import pytest
import torch
import torch.nn as nn
import torchvision

from addernet import Adder2d
from addernet.models import MODELS, NATIVE_DATA, build_model, model_label

from helpers import compose

# Every registered model made for one of the paper's datasets, built as the paper's rule says: the first
# convolution and the classifier multiplicative, every other convolution the body layer (model.layer).
# name -> (input channels, input size for the tests, number of classes); ImageNet nets run at any size >= 32.
SPECS = {
    name: (channels, min(NATIVE_DATA[family][1], 32), 10)
    for name, (_, family, channels) in MODELS.items()
    if family in NATIVE_DATA
}
FORMS = [(n, layer) for n in SPECS for layer in ("adder", "conv")]
FULL_SIZE = {n for n, (_, family, _) in MODELS.items() if family == "ImageNet"}  # their passes are slow tests


def _model(name, layer):
    c, _, k = SPECS[name]
    return build_model(name, layer=layer, num_classes=k, in_channels=c)


def _multiplicative(model):
    """The paper's multiplicative layers of a model: its first convolution, its classifier (the last weight
    layer, a 1x1 convolution in the ImageNet ResNets) and any other linear layer."""
    weights = [n for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear, Adder2d))]
    return {weights[0], weights[-1]} | {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}


@pytest.mark.parametrize(
    "name,layer", [pytest.param(n, layer, marks=[pytest.mark.slow] if n in FULL_SIZE else []) for n, layer in FORMS]
)
def test_forward_backward_shape_and_grads(name, layer):
    torch.manual_seed(0)
    c, s, k = SPECS[name]
    model = _model(name, layer)
    x = torch.randn(2, c, s, s)
    y = model(x)
    assert y.shape == (2, k)
    y.square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} got an all-zero gradient"


@pytest.mark.parametrize(
    "name,params", [("resnet20", 272_484), ("resnet50", 25_559_032), ("resnet18", 11_689_512 + 2 * 1000)]
)  # torchvision's + bn2
def test_parameter_counts(name, params):
    for layer in ("adder", "conv"):
        model = build_model(name, layer=layer, num_classes=10 if name == "resnet20" else 1000)
        assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name,layer", FORMS)
def test_adder_layers_exactly_where_the_twin_has_body_convolutions(name, layer):
    model = _model(name, layer)
    mult = _multiplicative(model)
    convs = {n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    adders = {n for n, m in model.named_modules() if isinstance(m, Adder2d)}
    weight_layers = {n for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear, Adder2d))}
    assert mult <= weight_layers and not (mult & adders)  # stem and classifier stay multiplicative
    body = weight_layers - mult
    assert body, "no body layers"
    assert (adders if layer == "adder" else convs - mult) == body
    assert not (adders if layer == "conv" else convs - mult)
    for n in body:  # every body layer has no bias
        assert model.get_submodule(n).bias is None, n


@pytest.mark.parametrize("name", SPECS)
def test_twins_have_identical_state_dict_layout(name):
    a, c = _model(name, "adder").state_dict(), _model(name, "conv").state_dict()
    assert list(a) == list(c)
    assert all(a[k].shape == c[k].shape for k in a)


@pytest.mark.parametrize("name", SPECS)
def test_every_body_layer_is_followed_by_batchnorm(name):
    """In execution order, the next arithmetic layer after each adder layer is a BatchNorm (pooling may sit between)."""
    c, s, k = SPECS[name]
    with torch.device("meta"):
        model = build_model(name, "conv", k, c).eval()
        body = {n for n, m in build_model(name, "adder", k, c).named_modules() if isinstance(m, Adder2d)}
    calls = []
    names = {m: n for n, m in model.named_modules()}
    for m in model.modules():
        if not list(m.children()):
            m.register_forward_hook(lambda mod, i, o: calls.append(mod))
    model(torch.empty(1, c, s, s, device="meta"))
    for i, m in enumerate(calls):
        if names[m] in body:
            nxt = next(x for x in calls[i + 1 :] if not isinstance(x, nn.MaxPool2d))
            assert isinstance(nxt, nn.BatchNorm2d), f"{names[m]} is followed by {names[nxt]}"


@pytest.mark.slow  # two full-size networks
def test_imagenet_resnets_match_torchvision_layout():
    """With torchvision's weights, our CNN ResNet-18/50 compute torchvision's logits (bn2 neutral in eval)."""
    torch.manual_seed(0)
    for name in ("resnet18", "resnet50"):
        ref = getattr(torchvision.models, name)(num_classes=7).eval()
        ours = build_model(name, "conv", num_classes=7).eval()
        sd = ref.state_dict()
        sd["fc.weight"] = sd["fc.weight"][:, :, None, None]
        missing, unexpected = ours.load_state_dict(sd, strict=False)
        assert not unexpected and sorted(missing) == ["bn2.bias", "bn2.running_mean", "bn2.running_var", "bn2.weight"]
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            expected = ref(x) / (1 + ours.bn2.eps) ** 0.5  # bn2 at init: running mean 0, var 1, affine 1/0
            torch.testing.assert_close(ours(x), expected, rtol=1e-4, atol=1e-5)


def test_initialisation():
    torch.manual_seed(0)
    adder, conv = build_model("resnet20", "adder"), build_model("resnet20", "conv")
    w = adder.layer3[1].conv2.weight  # Adder2d default: N(0, 1)
    assert abs(w.mean()) < 0.03 and abs(w.std() - 1) < 0.03
    w = conv.layer3[1].conv2.weight  # Kaiming normal, fan_out, ReLU gain: std sqrt(2 / (64*9))
    assert abs(w.std() / (2 / (64 * 9)) ** 0.5 - 1) < 0.03
    for m in list(adder.modules()) + list(conv.modules()):
        if isinstance(m, nn.BatchNorm2d):
            assert (m.weight == 1).all() and (m.bias == 0).all()


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown model 'resnet21': choose one of lenet5_bn, resnet18, resnet20, "):
        build_model("resnet21")
    with pytest.raises(ValueError, match="model.layer=adder or model.layer=conv"):
        build_model("resnet20", layer="mul")
    with pytest.raises(ValueError, match="num_classes"):
        build_model("resnet20", num_classes=0)
    with pytest.raises(ValueError, match="in_channels"):
        build_model("resnet20", in_channels=-3)


def test_in_channels_defaults_follow_the_dataset():
    assert build_model("lenet5_bn").conv1.in_channels == 1
    assert build_model("resnet20").conv1.in_channels == 3
    assert build_model("vgg_small", in_channels=1).conv0.in_channels == 1


@pytest.mark.parametrize(
    "name,data",
    [
        ("resnet20", "cifar10"),
        ("resnet32", "cifar100"),
        ("vgg_small", "cifar10"),
        ("lenet5_bn", "mnist"),
        ("resnet18", "imagenet"),
        ("resnet50", "imagenet"),
    ],
)
def test_model_configs_build_at_their_datasets_resolution(name, data):
    for layer in ("adder", "conv"):
        cfg = compose([f"model={name}", f"data={data}", f"model.layer={layer}"])
        with torch.device("meta"):
            model = build_model(
                cfg.model.name,
                layer=cfg.model.layer,
                num_classes=cfg.data.num_classes,
                in_channels=cfg.data.in_channels,
            ).eval()
        assert any(isinstance(m, Adder2d) for m in model.modules()) == (layer == "adder")
        if layer == "conv":  # shapes at the dataset's resolution (meta device: no arithmetic)
            s = cfg.data.image_size
            y = model(torch.empty(1, cfg.data.in_channels, s, s, device="meta"))
            assert y.shape == (1, cfg.data.num_classes)


def test_all_adder_lenet_has_every_weight_layer_adder_each_followed_by_batchnorm():
    from addernet import AdaptiveLR, AdderLinear

    model = build_model("lenet5_bn", "adder", adder_layers="all")
    weights = [n for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear, Adder2d, AdderLinear))]
    assert weights == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert all(isinstance(model.get_submodule(n), (Adder2d, AdderLinear)) for n in weights)
    assert AdaptiveLR(model).names == weights
    # what each adder layer's output feeds, in call order: a BatchNorm, always
    order = []
    for n, m in model.named_modules():
        if isinstance(m, (Adder2d, AdderLinear, nn.BatchNorm1d, nn.BatchNorm2d)):
            m.register_forward_hook(lambda mod, i, o, n=n: order.append(n))
    model(torch.randn(4, 1, 28, 28)).sum().backward()
    assert order == ["conv1", "bn1", "conv2", "bn2", "fc1", "bn3", "fc2", "bn4", "fc3", "bn5"]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    twin = build_model("lenet5_bn", "conv", adder_layers="all")
    assert {k: v.shape for k, v in twin.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert not any(isinstance(m, (Adder2d, AdderLinear)) for m in twin.modules())


def test_lenet_adder_layers_option_is_checked():
    with pytest.raises(ValueError, match="model.adder_layers=body"):
        build_model("lenet5_bn", "adder", adder_layers="fc")


def test_the_log_label_names_the_wrapped_torchvision_architecture():
    assert model_label(compose(["model=torchvision", "model.arch=mobilenet_v3_small"]).model) == (
        "torchvision mobilenet_v3_small (adder)"
    )
    assert model_label(compose(["model=resnet20", "model.layer=conv"]).model) == "resnet20 (conv)"
