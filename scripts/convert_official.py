"""Convert an official AdderNet checkpoint (huawei-noah/AdderNet) into this repo's checkpoint format.

    python scripts/convert_official.py ResNet20-AdderNet.pth resnet20_official.pt              # CIFAR-10
    python scripts/convert_official.py ResNet50-AdderNet.pth resnet50_official.pt --model resnet50

The output holds the renamed weights and a config (model and data groups, as configs/test.yaml
composes them), so `python test.py checkpoint=OUT` needs no model= override. The weights are
checked against the model before anything is written; the file is written atomically.
"""
import argparse
import hashlib
import os
import sys

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from addernet.checkpoint import FORMAT_VERSION, CheckpointError, load_checkpoint, save_checkpoint
from addernet.checkpoint.official import OFFICIAL_CLASSES, is_official, load_official, official_to_ours
from addernet.engine import ConfigError, model_from_config
from addernet.models import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Default data config per model family (the official files: ResNet-20 on CIFAR-10, ResNet-50 on ImageNet).
DATASETS = {"CIFAR": "cifar10", "MNIST": "mnist", "ImageNet": "imagenet"}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def convert(src, dst, model, layer, data):
    """Read the official file `src`, check it against `model`, write our checkpoint `dst`; returns dst."""
    ckpt = load_checkpoint(src, map_location="cpu")
    if not is_official(ckpt):
        raise CheckpointError(f"{src} is not a bare state_dict like the official AdderNet checkpoints"
                              + (" (it already is a checkpoint of this repo)" if isinstance(ckpt, dict)
                                 and "config" in ckpt else "") + "; nothing to convert.")
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        cfg = compose("test", overrides=[f"model={model}", f"model.layer={layer}", f"data={data}"])
    config = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("model", "data")}
    load_official(model_from_config(OmegaConf.create(config)), ckpt, source=src,
                  hint="Pick the checkpoint's architecture with --model (and --layer/--data).")
    out = {"format_version": FORMAT_VERSION, "model": official_to_ours(ckpt), "config": config,
           "source": {"file": os.path.basename(src), "sha256": sha256(src), "converted_by": "scripts/convert_official.py"}}
    if model in OFFICIAL_CLASSES and data == "cifar10":  # the class names the official weights were trained on
        out["classes"] = OFFICIAL_CLASSES[model]
    return save_checkpoint(out, dst)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", metavar="IN", help="official checkpoint, e.g. ResNet20-AdderNet.pth")
    p.add_argument("dst", metavar="OUT", help="output path (this repo's format)")
    p.add_argument("--model", default="resnet20", help="configs/model/<name> (default resnet20)")
    p.add_argument("--layer", default="adder", choices=("adder", "conv"))
    p.add_argument("--data", help="configs/data/<name> to store; default: cifar10 for CIFAR models (resnet20), "
                                  "imagenet for ImageNet models (resnet50)")
    args = p.parse_args(argv)
    if args.model not in MODELS:
        p.error(f"unknown --model {args.model!r}; choose one of {', '.join(MODELS)}")
    data = args.data or DATASETS[MODELS[args.model][1]]
    try:
        out = convert(args.src, args.dst, args.model, args.layer, data)
    except (CheckpointError, ConfigError) as e:
        sys.exit(f"convert_official.py: error: {e}")
    except Exception as e:  # bad --model/--data names surface as Hydra errors
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            sys.exit(f"convert_official.py: error: {e} (see configs/model/ and configs/data/)")
        raise
    print(f"wrote {out}: model={args.model} model.layer={args.layer} data={data}; "
          f"evaluate with: python test.py checkpoint={out}")


if __name__ == "__main__":
    main()
