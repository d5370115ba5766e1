"""Every experiment preset composes, carries the paper's recipe, and builds its model."""

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf

from addernet import Adder2d
from addernet.engine import ConfigError, check_config, model_from_config

from helpers import REPO, compose

# presets that are not a row of the paper's tables (conv2: the LeNet AdderNet variant with stem and fcs multiplicative)
NOT_PAPER_ROWS = {"quickstart", "debug", "mnist_lenet5_bn_adder_conv2"}
PRESETS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml") if p.stem not in NOT_PAPER_ROWS)
DATA_KEYS = {
    "name",
    "root",
    "num_classes",
    "image_size",
    "in_channels",
    "batch_size",
    "num_workers",
    "download",
    "pin_memory",
    "mean",
    "std",
    "transform",
}


def test_one_preset_per_paper_row():
    rows = {f"{d}_{m}" for d in ("cifar10", "cifar100") for m in ("resnet20", "resnet32", "vgg_small")}
    rows |= {"imagenet_resnet18", "imagenet_resnet50"}
    pkkd = {f"{r}_pkkd" for r in rows}  # PKKD rows (Xu et al. 2020): every CIFAR and ImageNet model, no MNIST
    rows |= {"mnist_lenet5_bn"}
    assert set(PRESETS) == {f"{r}_{form}" for r in rows for form in ("adder", "cnn")} | pkkd


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_with_the_paper_recipe_and_builds(preset):
    cfg = compose([f"experiment={preset}"])
    check_config(cfg)
    dataset, form = preset.split("_")[0], preset.rsplit("_", 1)[1]
    model_name = preset[len(dataset) + 1 : -len(form) - 1]
    assert cfg.model.name == model_name and cfg.data.name == dataset
    assert cfg.model.layer == ("conv" if form == "cnn" else "adder")  # pkkd: an AdderNet student
    assert cfg.adaptive_lr.enabled == (form != "cnn")
    assert cfg.task.name == ("pkkd" if form == "pkkd" else "classification")
    # Paper Sec. 4: SGD lr 0.1, momentum 0.9, batch 256, cosine; per-dataset epochs / wd / eta.
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.momentum, cfg.data.batch_size) == ("sgd", 0.1, 0.9, 256)
    assert cfg.sched.name == "cosine" and cfg.sched.eta_min == 0
    expected = {
        "cifar10": (400, 5e-4, 0.2),
        "cifar100": (400, 5e-4, 0.2),
        "mnist": (50, 5e-4, 0.2),
        "imagenet": (150, 1e-4, 0.05),
    }[dataset]
    assert (cfg.trainer.epochs, cfg.optim.weight_decay) == expected[:2]
    if form != "cnn":
        assert cfg.adaptive_lr.eta == expected[2]
    if dataset.startswith("cifar"):
        assert list(cfg.data.mean) == [0.4914, 0.4822, 0.4465] and list(cfg.data.std) == [0.2023, 0.1994, 0.2010]
        assert cfg.data.transform == "cifar" and cfg.data.image_size == 32
        assert cfg.data.num_classes == int(dataset[5:])
    if dataset == "imagenet":
        assert cfg.data.transform == "imagenet" and cfg.data.image_size == 224 and cfg.data.num_classes == 1000

    model = model_from_config(cfg)
    n_adder = sum(isinstance(m, Adder2d) for m in model.modules())
    assert (n_adder > 0) == (form != "cnn")
    if preset == "mnist_lenet5_bn_adder":  # the paper's network: every conv and fc an adder layer (Sec. 4.1)
        assert cfg.model.adder_layers == "all"
        assert not any(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())
    if dataset != "imagenet" and (form == "cnn" or model_name in ("resnet20", "lenet5_bn")):
        size = cfg.data.image_size
        x = torch.randn(2, cfg.data.in_channels, size, size)
        model.eval()
        with torch.no_grad():
            assert model(x).flatten(1).shape == (2, cfg.data.num_classes)


def test_plain_train_py_is_the_headline_experiment():
    default = OmegaConf.to_container(compose([]), resolve=True)
    assert default == OmegaConf.to_container(compose(["experiment=cifar10_resnet20_adder"]), resolve=True)


@pytest.mark.parametrize(
    "data", sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml") if not p.stem.startswith("_"))
)  # a file named _*.yaml would be a block the options include, not an option
def test_data_configs_share_the_contract(data):
    cfg = compose([f"data={data}"])
    assert DATA_KEYS <= set(cfg.data)
    if data == "fake":
        assert {"train_size", "val_size"} <= set(cfg.data)
    if data.endswith("_folder") or data == "imagenet":
        assert {"train_dir", "val_dir"} <= set(cfg.data)


def test_folder_val_dir_defaults_to_root_and_overrides_alone():
    cfg = compose(["data=cifar10_folder", "data.root=/x/cifar"])
    assert (cfg.data.train_dir, cfg.data.val_dir) == ("/x/cifar/train", "/x/cifar/test")
    cfg = compose(["data=cifar10_folder", "data.val_dir=/elsewhere"])
    assert cfg.data.val_dir == "/elsewhere" and cfg.data.train_dir.endswith("cifar10_folder/train")
    assert compose(["data=cifar100_folder"]).data.num_classes == 100


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.amp=fp8", "trainer.amp='fp8' is not valid"),
        ("model.layer=mul", "model.layer='mul' is not valid"),
        ("data.batch_size=0", "data.batch_size must be an integer >= 1"),
        ("adaptive_lr.eta=-1", "adaptive_lr.eta must be a positive number"),
        ("trainer.device=tpu", "trainer.device='tpu' is not valid"),
        ("data.in_channels=1", "data.mean has 3 value.* but data.in_channels=1; give one per channel"),
    ],
)
def test_bad_values_give_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        check_config(compose([override]))


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match="model.name='resnet99'.*resnet20"):
        model_from_config(compose(["model.name=resnet99"]))


def test_every_experiment_file_documents_its_paper_number():
    for p in Path(REPO / "configs" / "experiment").glob("*.yaml"):
        if p.stem in NOT_PAPER_ROWS:
            continue
        text = p.read_text()
        assert text.startswith("# @package _global_") and "paper" in text and "%" in text, p.name


def test_conv2_only_lenet_variant_keeps_stem_and_fcs_multiplicative():
    model = model_from_config(compose(["experiment=mnist_lenet5_bn_adder_conv2"]))
    assert [n for n, m in model.named_modules() if isinstance(m, Adder2d)] == ["conv2"]
    assert {n for n, m in model.named_modules() if isinstance(m, nn.Linear)} == {"fc1", "fc2", "fc3"}
