"""Every preset composes to the recipe it had before the optional training features existed.

tests/data/preset_configs.json holds the resolved config of train.yaml and of every configs/experiment preset,
composed from the configs without those features (the keys in NEW_KEYS). Composing them now and removing the
new keys must give exactly those values; the new keys must be at their off value in every preset.
"""
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import REPO, compose

REFERENCE = json.loads((Path(__file__).parent / "data" / "preset_configs.json").read_text())
# key -> its off value (the new option is disabled)
NEW_KEYS = {
    "task.label_smoothing": 0.0,
    "trainer.clip_grad_norm": None,
    "trainer.accumulate": 1,
    "trainer.ema_decay": None,
}


def _split(config):
    """(config without NEW_KEYS, {key: value} of the NEW_KEYS present)."""
    found = {}
    for dotted in NEW_KEYS:
        *parents, leaf = dotted.split(".")
        node = config
        for p in parents:
            node = node.get(p, {})
        if leaf in node:
            found[dotted] = node.pop(leaf)
    return config, found


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_preset_composes_to_the_same_values_with_every_new_option_off(preset):
    assert {p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml")} <= set(REFERENCE) | {"debug"}
    cfg = compose([] if preset == "(defaults)" else [f"experiment={preset}"])
    config, found = _split(OmegaConf.to_container(cfg, resolve=True))
    assert config == REFERENCE[preset]
    assert found == NEW_KEYS
