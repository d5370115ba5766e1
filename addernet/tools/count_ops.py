"""Parameters, multiplications, additions and energy of one forward pass of a model.

    python -m addernet.tools.count_ops model=resnet20                  # AdderNet ResNet-20, CIFAR-10 input
    python -m addernet.tools.count_ops model=resnet20 model.layer=conv # its CNN twin
    python -m addernet.tools.count_ops model=resnet50                  # ImageNet models at 224x224
    python -m addernet.tools.count_ops model=resnet50 data=cifar10     # ... or at another dataset's input
    python -m addernet.tools.count_ops model=vit data=mnist            # adder ViT (AdderLinear, adder attention)
    python -m addernet.tools.count_ops model=torchvision model.arch=mobilenet_v2   # any adderized torchvision net

(``scripts/count_ops.py`` is the same command.) The input is one image at the resolution and channel
count of the ``data`` config, which defaults to the model's own dataset (CIFAR models: cifar10,
lenet5_bn: mnist, ImageNet models: imagenet); counting runs on the meta device (shapes only), so it
takes seconds for any model. The conventions are in addernet/analysis/op_count.py. The last line
printed is one JSON object with every figure.
"""

import json
import sys

from omegaconf import OmegaConf

from ..analysis import count_model_ops, format_report
from ..config.entry import run_entry
from ..errors import reported
from ..models import MODELS, NATIVE_DATA


def native_data(argv):
    """``data=<the model's own dataset>`` unless argv chooses data (or an experiment) itself, else None."""
    if any(a.lstrip("+~").split("=")[0] in ("data", "experiment") for a in argv):
        return None
    names = [a.split("=", 1)[1] for a in argv if a.startswith("model=")]
    name = names[-1] if names else "resnet20"
    return f"data={NATIVE_DATA[MODELS[name][1]][0]}" if name in MODELS and MODELS[name][1] in NATIVE_DATA else None


def task(cfg):
    with reported("count_ops.py", errors=(ValueError,)):
        options = {
            k: v
            for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()
            if k not in ("name", "layer", "image_size")
        }  # the input size is data.image_size
        result = count_model_ops(
            cfg.model.name, cfg.model.layer, cfg.data.num_classes, cfg.data.in_channels, cfg.data.image_size, **options
        )
    print(format_report(result))
    print(json.dumps(result))


def cli():
    # A read-only tool: write no Hydra run directory (the user's own overrides come later and win).
    native = native_data(sys.argv[1:])
    sys.argv[1:1] = ["hydra.output_subdir=null", "hydra.run.dir=."] + ([native] if native else [])
    run_entry("count_ops.py", "train", task)


if __name__ == "__main__":
    cli()
