"""Parameters, multiplications, additions and energy of one forward pass of a model.

    python scripts/count_ops.py model=resnet20                  # AdderNet ResNet-20, CIFAR-10 input
    python scripts/count_ops.py model=resnet20 model.layer=conv # its CNN twin
    python scripts/count_ops.py model=resnet50 data=imagenet    # ImageNet models at 224x224

The input is one image at the resolution and channel count of the `data` config; counting runs
on the meta device (shapes only), so it takes seconds for any model. The conventions are in
addernet/analysis/op_count.py. The last line printed is one JSON object with every figure.
"""
import json
import sys

import hydra

from addernet.analysis import count_model_ops, format_report


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg):
    try:
        result = count_model_ops(cfg.model.name, cfg.model.layer, cfg.data.num_classes,
                                 cfg.data.in_channels, cfg.data.image_size)
    except ValueError as e:
        sys.exit(f"count_ops: {e}")
    print(format_report(result))
    print(json.dumps(result))


if __name__ == "__main__":
    # A read-only tool: write no Hydra run directory (the user's own overrides come later and win).
    sys.argv[1:1] = ["hydra.output_subdir=null", "hydra.run.dir=."]
    main()
