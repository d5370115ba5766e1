"""Official AdderNet checkpoints: format recognition, key mapping onto our models, checked loading."""

from collections import OrderedDict

import pytest
import torch

from addernet import Adder2d
from addernet.checkpoint import CheckpointError, load_checkpoint, load_weights
from addernet.checkpoint.official import is_official, load_official, official_to_ours
from addernet.models import build_model


def _as_official(model):
    """The state_dict the official code would save for `model`: DataParallel prefix, adder weights as `adder`."""
    adders = {name for name, m in model.named_modules() if isinstance(m, Adder2d)}
    out = OrderedDict()
    for k, v in model.state_dict().items():
        module, _, leaf = k.rpartition(".")
        out["module." + (f"{module}.adder" if module in adders and leaf == "weight" else k)] = v.clone()
    return out


def test_renaming_strips_dataparallel_prefix_and_adder_names():
    sd = OrderedDict(
        [
            ("module.conv1.weight", torch.zeros(1)),
            ("module.layer1.0.conv1.adder", torch.ones(2)),
            ("module.layer1.0.conv1.b", torch.full((2,), 3.0)),  # official adder2d bias
            ("module.head.b", torch.full((1,), 4.0)),  # a `b` that is not an adder's stays as it is
            ("bn.running_mean", torch.zeros(3)),
        ]
    )
    out = official_to_ours(sd)
    assert list(out) == ["conv1.weight", "layer1.0.conv1.weight", "layer1.0.conv1.bias", "head.b", "bn.running_mean"]
    assert torch.equal(out["layer1.0.conv1.bias"], sd["module.layer1.0.conv1.b"])


@pytest.mark.parametrize("name", ["resnet20", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_official_layout_round_trips_onto_our_models(name):
    """A state_dict in the official layout (as the official resnet20.py/resnet50.py save it) loads exactly."""
    torch.manual_seed(0)
    src = build_model(name, num_classes=10)
    dst = build_model(name, num_classes=10)
    load_official(dst, _as_official(src), source="synthetic")
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k


def test_is_official_only_for_bare_state_dicts():
    sd = build_model("lenet5_bn").state_dict()
    assert is_official(sd)
    assert not is_official({"format_version": 1, "model": sd, "config": {"model": {"name": "lenet5_bn"}}})
    assert not is_official({})
    assert not is_official([torch.zeros(1)])


def test_wrong_architecture_lists_missing_unexpected_and_misshaped_keys():
    src = build_model("resnet20", layer="conv").state_dict()
    model = build_model("resnet32", layer="conv", num_classes=100)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as e:
        load_weights(model, src, source="r20.pt", hint="use model=resnet20")
    msg = str(e.value)
    assert "r20.pt does not fit the model" in msg
    assert "missing in the checkpoint (72)" in msg and "layer1.3.conv1.weight" in msg
    assert "mis-shaped (5)" in msg and "fc.weight: checkpoint (10, 64, 1, 1) vs model (100, 64, 1, 1)" in msg
    assert "unexpected" not in msg
    assert msg.endswith("use model=resnet20")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing half-loaded

    with pytest.raises(CheckpointError, match=r"unexpected in the checkpoint \(72\)"):
        load_weights(build_model("resnet20", layer="conv"), build_model("resnet32", layer="conv").state_dict())


def test_adder_weights_refuse_to_load_into_the_cnn_twin():
    official = _as_official(build_model("resnet20"))
    with pytest.raises(CheckpointError, match=r"holds adder weights.*Conv2d, not Adder2d") as e:
        load_official(build_model("resnet20", layer="conv"), official, source="official.pth")
    assert "layer2.0.downsample.0" in str(e.value)


def test_real_official_resnet20_maps_key_for_key(official_r20):
    """The shared file (legacy format, CUDA storages, `module.`, `adder`) loads with weights_only and fits resnet20."""
    raw = load_checkpoint(official_r20, map_location="cpu")
    assert is_official(raw) and len(raw) == 132 and all(k.startswith("module.") for k in raw)
    ours = official_to_ours(raw)
    model = build_model("resnet20")
    expected = model.state_dict()
    assert list(ours) == list(expected)  # same names, same order
    assert all(ours[k].shape == expected[k].shape for k in ours)
    load_official(model, raw, source=str(official_r20))
    adders = [n for n, m in model.named_modules() if isinstance(m, Adder2d)]
    assert len(adders) == 20  # 18 3x3 body layers + 2 1x1 shortcut projections
    for n in adders:
        assert torch.equal(dict(model.named_modules())[n].weight, raw[f"module.{n}.adder"])
    assert torch.equal(model.fc.weight, raw["module.fc.weight"])
    assert torch.equal(model.bn2.running_var, raw["module.bn2.running_var"])
