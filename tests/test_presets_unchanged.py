"""Every preset composes to its recipe with every optional training feature off.

tests/data/preset_configs.json holds the resolved config of train.yaml and of every configs/experiment preset,
composed from the configs without those features (the keys in NEW_KEYS); the MNIST presets hold their data
as one tensor (data.on_device=true), which gives the same batches as the per-image path. Composing them and
removing those keys must give exactly those values; those keys must be at their off value in every preset.

tests/data/composed_configs.json holds the whole resolved config of every configs/experiment preset, every
configs/data option (composed into train.yaml), train.yaml and test.yaml: the schema's defaults
(addernet/config/schema.py), the options, and the blocks the presets include (configs/experiment/_blocks/) must
compose to exactly those values. After an intended change to a config, regenerate it from the repository root
with ``python tests/test_presets_unchanged.py --write`` and review the diff.
"""

import json
import sys

import pytest
from omegaconf import OmegaConf

from helpers import REPO, TESTS, compose

REFERENCE = json.loads((TESTS / "data" / "preset_configs.json").read_text())
# key -> its off value (the option is disabled)
NEW_KEYS = {
    "task.label_smoothing": 0.0,
    "trainer.clip_grad_norm": None,
    "trainer.accumulate": 1,
    "trainer.ema_decay": None,
    "trainer.precise_bn": 0,
    "data.train_size": None,
    "data.val_size": None,
    "data.auto_augment": None,
    "data.random_erasing": 0.0,
    "data.mixup_alpha": 0.0,
    "data.cutmix_alpha": 0.0,
    "logger": {"tensorboard": {}},
    "trainer.backend": "fast",  # the adder kernels (ADDERNET_BACKEND unset)
    "trainer.resume_override": False,  # resume refuses changed settings unless this is set
    "trainer.dist_timeout": 600,  # seconds a rank waits for a stalled peer
    "trainer.cuda_graph": False,  # the training forward and backward replayed as CUDA graphs
    "trainer.retain_freed_memory": True,  # the allocator keeps freed memory: no effect on what is trained
}
# data.name -> the data keys that say how it is loaded (data.kind and its keys), as the name-keyed tables did
DATA_KINDS = {
    "cifar10": {"kind": "torchvision", "dataset": "CIFAR10"},
    "cifar100": {"kind": "torchvision", "dataset": "CIFAR100"},
    "mnist": {"kind": "torchvision", "dataset": "MNIST"},
    "cifar10_folder": {"kind": "folder", "dataset": None, "native_size": 32},
    "cifar100_folder": {"kind": "folder", "dataset": None, "native_size": 32},
    "imagenet": {"kind": "folder", "native_size": None},
    "fake": {"kind": "fake"},
}


def _pop_data_kind(config):
    """Check and remove the data keys that say how the data is loaded (they replaced tables keyed by data.name)."""
    kind = {k: config["data"].pop(k) for k in ("kind", "dataset", "native_size") if k in config["data"]}
    assert kind == DATA_KINDS[config["data"]["name"]]


def _split(config, reference):
    """(config without the NEW_KEYS that ``reference`` lacks, {key: value} of those removed)."""
    found = {}
    for dotted in NEW_KEYS:
        *parents, leaf = dotted.split(".")
        node, ref = config, reference
        for p in parents:
            node, ref = node.get(p, {}), ref.get(p, {})
        if leaf in node and leaf not in ref:  # data.train_size: FakeData's own key keeps its value
            found[dotted] = node.pop(leaf)
    return config, found


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_preset_composes_to_the_same_values_with_every_new_option_off(preset):
    assert {p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml")} <= set(REFERENCE) | {"debug"}
    cfg = compose([] if preset == "(defaults)" else [f"experiment={preset}"])
    config, found = _split(OmegaConf.to_container(cfg, resolve=True), REFERENCE[preset])
    _pop_data_kind(config)
    assert config == REFERENCE[preset]
    assert found == {k: v for k, v in NEW_KEYS.items() if k in found}
    assert set(NEW_KEYS) - set(found) <= {"data.train_size", "data.val_size"}  # FakeData's sizes stay as they were


COMPOSED_FILE = REPO / "tests" / "data" / "composed_configs.json"
COMPOSED = json.loads(COMPOSED_FILE.read_text())


def _options(group):
    """The options of configs/<group>/ (files starting with ``_`` are blocks the options include)."""
    return {p.stem for p in (REPO / "configs" / group).glob("*.yaml") if not p.stem.startswith("_")}


def test_every_preset_and_data_option_is_pinned():
    pinned = {k for k in COMPOSED if "=" in k}
    assert pinned == {f"experiment={p}" for p in _options("experiment")} | {f"data={d}" for d in _options("data")}


def _composed(choice):
    """The resolved config of one pinned choice, without the data-kind keys and trainer.backend (checked here)."""
    if choice == "(test.yaml)":
        # what an official checkpoint (no stored config) is evaluated with: test.yaml leaves model/data to it
        cfg = compose(["checkpoint=x.pt", "model=resnet20", "data=cifar10"], config_name="test")
    else:
        cfg = compose([] if choice == "(train.yaml)" else [choice])
    config = OmegaConf.to_container(cfg, resolve=True)
    _pop_data_kind(config)
    if "backend" in config.get("trainer", {}):
        assert config["trainer"].pop("backend") == NEW_KEYS["trainer.backend"]
    return config


@pytest.mark.parametrize("choice", sorted(COMPOSED))
def test_composes_to_exactly_the_pinned_config(choice):
    assert _composed(choice) == COMPOSED[choice]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:  # regenerate composed_configs.json (see the docstring)
    choices = ["(train.yaml)", "(test.yaml)"]
    choices += [f"experiment={p}" for p in sorted(_options("experiment"))] + [
        f"data={d}" for d in sorted(_options("data"))
    ]
    COMPOSED_FILE.write_text(json.dumps({c: _composed(c) for c in sorted(choices)}, indent=1, sort_keys=True) + "\n")
