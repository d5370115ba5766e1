"""Convert an official AdderNet checkpoint (huawei-noah/AdderNet) into this repo's checkpoint format.

    python -m addernet.tools.convert_official ResNet20-AdderNet.pth resnet20_official.pt              # CIFAR-10
    python -m addernet.tools.convert_official ResNet50-AdderNet.pth resnet50_official.pt --model resnet50

(``scripts/convert_official.py`` is the same command.) The output holds the renamed weights and a
config (model and data groups, as configs/test.yaml composes them), so ``python test.py checkpoint=OUT``
needs no model= override. The weights are checked against the model before anything is written; the
file is written atomically (addernet.checkpoint.official.convert_official). OUT never is IN, and it replaces an
existing file only when that is an earlier conversion, or with ``--overwrite``.
"""

import argparse
import os

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checkpoint import FORMAT_VERSION, load_checkpoint
from ..checkpoint.official import convert_official
from ..checks import output_file
from ..config import config_dir
from ..config.validate import one_line
from ..engine import model_from_config
from ..errors import CheckpointError, ConfigError, reported
from ..models import MODELS

# Default data config per model family (the official files: ResNet-20 on CIFAR-10, ResNet-50 on ImageNet).
DATASETS = {"CIFAR": "cifar10", "MNIST": "mnist", "ImageNet": "imagenet"}


def _converted(path):
    """Whether ``path`` is a checkpoint this command wrote (it records its source)."""
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError:
        return False
    return isinstance(ckpt, dict) and (ckpt.get("source") or {}).get("converted_by") == "scripts/convert_official.py"


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
    p.add_argument("--overwrite", action="store_true", help="let OUT replace a file that is not a converted checkpoint")
    args = p.parse_args(argv)
    if args.model not in MODELS:
        p.error(f"unknown --model {args.model!r}; choose one of {', '.join(MODELS)}")
    data = args.data or DATASETS[MODELS[args.model][1]]
    overrides = [f"model={args.model}", f"model.layer={args.layer}", f"data={data}"]
    with reported("convert_official.py", errors=(OmegaConfBaseException,)):
        if os.path.exists(args.src) and os.path.realpath(args.dst) == os.path.realpath(args.src):
            raise ConfigError(
                f"OUT {args.dst} is IN itself; converting would replace the official file. Give another OUT."
            )
        output_file(args.dst, "OUT", _converted, args.overwrite)
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
