"""The model table: name -> (constructor, dataset family, default input channels).

A model is one module whose constructor is decorated with ``@register_model(name, ...)`` plus a
``configs/model/<name>.yaml`` with ``name:`` and ``layer:`` (and the constructor's own keyword options,
which ``build_model`` passes through). The constructor is called as
``fn(layer=..., num_classes=..., in_channels=..., **options)``.
"""

from ..registry import registrar

MODELS = {}
_put = registrar(MODELS, "model")


def register_model(name, dataset=None, in_channels=3):
    """Decorator adding a model constructor to MODELS; ``dataset`` is the family it is made for (CIFAR, MNIST,
    ImageNet; None for a model made for any input) and ``in_channels`` its default input channels."""

    def add(fn):
        _put(name)((fn, dataset, in_channels))
        return fn

    return add
