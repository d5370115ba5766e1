"""The paper's models, each as an AdderNet (`layer="adder"`) or its CNN twin (`layer="conv"`).

In both forms the first convolution and the classifier are multiplicative; every other
convolution (shortcut projections included) is the body layer chosen by `layer`, followed by BN.
"""
from .layers import LAYERS
from .lenet import lenet5_bn
from .resnet_cifar import resnet20, resnet32
from .resnet_imagenet import resnet18, resnet50
from .vgg import vgg_small

# name -> (constructor, dataset, default input channels)
MODELS = {
    "resnet20": (resnet20, "CIFAR", 3),
    "resnet32": (resnet32, "CIFAR", 3),
    "vgg_small": (vgg_small, "CIFAR", 3),
    "lenet5_bn": (lenet5_bn, "MNIST", 1),
    "resnet18": (resnet18, "ImageNet", 3),
    "resnet50": (resnet50, "ImageNet", 3),
}


# dataset family -> (configs/data/<name>.yaml, input side) the family's models are made for
NATIVE_DATA = {"CIFAR": ("cifar10", 32), "MNIST": ("mnist", 28), "ImageNet": ("imagenet", 224)}


def list_models():
    """Names accepted by build_model."""
    return list(MODELS)


def build_model(name, layer="adder", num_classes=10, in_channels=None):
    """Build model `name` with adder (`layer="adder"`) or convolution (`layer="conv"`) body layers.

    `in_channels=None` takes the model's dataset default (1 for lenet5_bn, else 3).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)} (e.g. model=resnet20)")
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r} for model {name!r}: use model.layer=adder or model.layer=conv")
    for arg, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    fn, _, default_in = MODELS[name]
    return fn(layer=layer, num_classes=num_classes, in_channels=in_channels or default_in)


__all__ = ["MODELS", "LAYERS", "NATIVE_DATA", "build_model", "list_models"]
