"""Extending the package from outside it (docs/extending.md): a model registered here and a folder dataset
that is one YAML file in tests/configs/ train through train.py's own entry function, with no package change."""

import json
import runpy
import sys

import pytest
import torch
import torch.nn as nn

from addernet.checkpoint import load_checkpoint
from addernet.models import build_model, register_model
from addernet.models.layers import body_conv, init_weights

from helpers import REPO

TEST_CONFIGS = REPO / "tests" / "configs"


@register_model("tiny_test_net")  # no dataset family: a model for any input
def tiny_test_net(layer="adder", num_classes=10, in_channels=3):
    """A stem convolution, one body layer (adder or conv) with BatchNorm, pooling and a classifier."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        body_conv(layer)(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )
    init_weights(model)
    return model


def test_a_model_and_a_folder_dataset_added_outside_the_package_train(jpeg_cifar, tmp_path, monkeypatch, one_thread):
    run = tmp_path / "run"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "train.py",
            f"hydra.searchpath=[file://{TEST_CONFIGS}]",
            "model=tiny_test_net",
            "data=tiny_folder",
            f"data.root={jpeg_cifar}",
            "trainer.epochs=1",
            "trainer.progress=false",
            f"hydra.run.dir={run}",
        ],
    )
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")  # python train.py ..., in this process
    assert exit_.value.code == 0

    config = (run / "config.yaml").read_text()
    assert "name: tiny_test_net" in config and "name: tiny_folder" in config
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["val_n"] == 37  # every image of the folder's test/ tree
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["classes"] == sorted(p.name for p in (jpeg_cifar / "train").iterdir())
    fresh = build_model("tiny_test_net", layer="adder", num_classes=4)
    assert {k: v.shape for k, v in ckpt["model"].items()} == {k: v.shape for k, v in fresh.state_dict().items()}
    assert type(dict(fresh.named_modules())["3"]).__name__ == "Adder2d"
    assert not torch.equal(ckpt["model"]["3.weight"], fresh.state_dict()["3.weight"])  # it trained


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="model 'resnet20' is registered twice"):
        register_model("resnet20")(tiny_test_net)
