"""Convert an official AdderNet checkpoint (huawei-noah/AdderNet) into this repo's checkpoint format.

    python -m addernet.tools.convert_official ResNet20-AdderNet.pth resnet20_official.pt              # CIFAR-10
    python -m addernet.tools.convert_official ResNet50-AdderNet.pth resnet50_official.pt --model resnet50

(``scripts/convert_official.py`` is the same command.) The output holds the renamed weights and a
config (model and data groups, as configs/test.yaml composes them), so ``python test.py checkpoint=OUT``
needs no model= override. The weights are checked against the model before anything is written; the
file is written atomically (addernet.checkpoint.official.convert_official).
"""

import argparse

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checkpoint import FORMAT_VERSION
from ..checkpoint.official import convert_official
from ..config import config_dir
from ..config.validate import one_line
from ..engine import model_from_config
from ..errors import ConfigError, reported
from ..models import MODELS

# Default data config per model family (the official files: ResNet-20 on CIFAR-10, ResNet-50 on ImageNet).
DATASETS = {"CIFAR": "cifar10", "MNIST": "mnist", "ImageNet": "imagenet"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", metavar="IN", help="official checkpoint, e.g. ResNet20-AdderNet.pth")
    p.add_argument("dst", metavar="OUT", help="output path (this repo's format)")
    p.add_argument("--model", default="resnet20", help="configs/model/<name> (default resnet20)")
    p.add_argument("--layer", default="adder", choices=("adder", "conv"))
    p.add_argument(
        "--data",
        help="configs/data/<name> to store; default: cifar10 for CIFAR models (resnet20), "
        "imagenet for ImageNet models (resnet50)",
    )
    args = p.parse_args(argv)
    if args.model not in MODELS:
        p.error(f"unknown --model {args.model!r}; choose one of {', '.join(MODELS)}")
    data = args.data or DATASETS[MODELS[args.model][1]]
    overrides = [f"model={args.model}", f"model.layer={args.layer}", f"data={data}"]
    with reported("convert_official.py", errors=(OmegaConfBaseException,)):
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            try:
                cfg = compose("test", overrides=overrides)
            except HydraException as e:  # e.g. a data name that is not in configs/data/: the choices
                raise ConfigError(one_line(e)) from None
        config = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("model", "data")}
        out = convert_official(
            args.src,
            args.dst,
            model_from_config(OmegaConf.create(config)),
            config,
            format_version=FORMAT_VERSION,
            hint="Pick the checkpoint's architecture with --model (and --layer/--data).",
        )
    print(
        f"wrote {out}: model={args.model} model.layer={args.layer} data={data}; "
        f"evaluate with: python test.py checkpoint={out}"
    )


if __name__ == "__main__":
    main()
