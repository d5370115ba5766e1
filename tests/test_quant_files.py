"""What a quantised model does with bad material: edited quantised files are refused naming the field,
non-finite inputs give NaN in every runtime, calibration ranges at the floor are reported, and quant settings
that do not apply are refused."""

import functools
import re
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from addernet.checkpoint import CheckpointError
from addernet.errors import ConfigError
from addernet.models import build_model
from addernet.quant import (
    IntegerResNet,
    inference_model,
    load_quantized,
    load_quantized_into,
    quant_summary,
    quantize_for_eval,
    quantize_model,
    save_quantized,
)
from addernet.quant.qadder import _int_kernel

from helpers import compose

QUANT = OmegaConf.merge(
    compose(["checkpoint=x.pt"], config_name="test").quant, {"bits": 8, "groups": 4, "bn_recalib": False}
)
CONFIG = {"model": {"name": "resnet20", "layer": "adder"}, "data": {"num_classes": 10, "in_channels": 3}}


def _loader(n=8, seed=0):
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.zeros(n)), batch_size=8)


@torch.no_grad()
def _resnet20():
    """A float ResNet-20 with BatchNorm statistics of its own activations (so every layer sees inputs)."""
    torch.manual_seed(0)
    model = build_model("resnet20")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()(next(iter(_loader(8, 3)))[0])
    return model.eval()


@functools.cache  # read only by the tests
def _quantised():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a few ranges at the floor (random weights)
        return quantize_model(_resnet20(), _loader(), QUANT)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_quantized(tmp_path_factory.mktemp("q") / "q8.pt", _quantised(), CONFIG, {"bits": 8})


def _set(key, value):
    def edit(state):
        state[key] = value if not callable(value) else value(state[key])

    return edit


def _every(field, value):
    def edit(state):
        for k in [k for k in state if k.endswith(f".{field}")]:
            state[k] = value(state[k])

    return edit


TAMPERED = [
    (_set("layer2.0.conv1.scale", torch.neg), r"layer2\.0\.conv1\.scale holds a value that is not a finite number > 0"),
    (_set("layer1.0.conv1.scale", torch.zeros_like), r"layer1\.0\.conv1\.scale holds a value that is not a finite"),
    (_set("layer1.1.conv2.scale", lambda s: s * 1e3), r"layer1\.1\.conv2\.scale holds .*, above act_range"),
    (_every("bits", lambda b: torch.tensor(0)), r"layer1\.0\.conv1\.bits is 0, outside 2\.\.16"),
    (_every("bits", lambda b: torch.tensor(100)), r"layer1\.0\.conv1\.bits is 100, outside 2\.\.16"),
    (_set("layer3.0.conv2.bits", torch.tensor(6)), r"layer3\.0\.conv2\.bits is 6, but layer layer1\.0\.conv1 has 8"),
    (_set("layer1.0.conv1.bits", torch.tensor(12)), r"layer1\.0\.conv1\.qweight is a 4-D torch\.uint8 tensor, not"),
    (_every("weight_step", lambda s: torch.tensor(3)), r"layer1\.0\.conv1\.weight_step is 3, not 1 \(unsigned"),
    (_set("layer2.0.conv2.weight_step", torch.tensor(2)), r"layer2\.0\.conv2\.qweight is a 4-D torch\.uint8 tensor"),
    (
        _set("layer2.0.conv2.weight_step", torch.tensor(2.0)),
        r"layer2\.0\.conv2\.weight_step is a 0-D torch\.float32 tensor, not",
    ),
    (_set("layer1.0.bn1.running_var", lambda v: -v), r"layer1\.0\.bn1\.running_var holds a negative value"),
    (_set("layer2.1.conv1.act_range", torch.tensor(0.0)), r"layer2\.1\.conv1\.act_range is 0, not a finite"),
    (_set("layer2.1.conv1.act_range", torch.tensor(-2.0)), r"layer2\.1\.conv1\.act_range is -2, not a finite"),
    (_set("layer1.2.conv1.group", lambda g: g - 1 - g.max()), r"layer1\.2\.conv1\.group must be 16 group indices"),
    (_set("layer1.2.conv1.group", lambda g: g.clamp(max=0) + 7), r"layer1\.2\.conv1\.group must be .* in 0\.\.3"),
    (_set("layer3.2.conv2.bias_term", lambda b: b.abs() + 1), r"layer3\.2\.conv2\.bias_term must be 64 finite"),
    (_set("layer1.0.conv2.qweight", lambda w: w.float()), r"layer1\.0\.conv2\.qweight is a 4-D torch\.float32"),
]


@pytest.mark.parametrize("edit,match", TAMPERED)
@pytest.mark.parametrize("runtime", ["auto", "layers"])
def test_edited_quantised_files_are_refused_naming_the_field(saved, tmp_path, edit, match, runtime):
    ckpt = torch.load(saved, weights_only=True)
    edit(ckpt["model"])
    torch.save(ckpt, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match=match) as e:
        load_quantized(tmp_path / "edited.pt", runtime=runtime)
    assert "\n" not in str(e.value) and "edited.pt" in str(e.value)


def test_the_untouched_file_loads_and_gives_the_models_logits(saved):
    x = next(iter(_loader(4, 1)))[0]
    model, _ = load_quantized_into(build_model("resnet20").eval(), saved)
    with torch.no_grad():
        assert torch.equal(model(x), _quantised()(x))


@pytest.mark.parametrize("runtime", ["integer", "layers"])
def test_a_sample_with_nan_or_inf_gives_nan_logits_in_every_runtime(runtime):
    if runtime == "integer" and _int_kernel() is None:
        pytest.skip("the integer kernel cannot be built here")
    model = _quantised()
    net, used = inference_model(model, runtime)
    assert isinstance(net, IntegerResNet) == (runtime == "integer") and used.startswith(runtime)
    x = next(iter(_loader(4, 2)))[0]
    x[1] = float("nan")
    x[2, 1, 5, 7] = float("inf")
    x[3, 0, 0, 0] = float("-inf")
    with torch.no_grad():
        y, alone = net(x), net(x[:1])
    assert torch.isnan(y[1:]).all()  # as the float model gives
    assert torch.isfinite(y[0]).all()  # the other samples are unaffected
    torch.testing.assert_close(y[0], alone[0], rtol=1e-4, atol=1e-4)


def test_a_layer_whose_calibration_inputs_are_all_zero_is_reported():
    model = _resnet20()
    with torch.no_grad():  # layer1.0.bn1 outputs 0, so layer1.0.conv2 reads only zeros
        model.layer1[0].bn1.weight.zero_()
        model.layer1[0].bn1.bias.zero_()
    with pytest.warns(
        RuntimeWarning, match=r"adder layer\(s\) saw no input above the activation range .*layer1\.0\.conv2"
    ):
        quantize_model(model, _loader(), QUANT)
    floored = quant_summary(model)["floored_layers"]
    assert "layer1.0.conv2" in floored and "layer1.0.conv2" not in quant_summary(_quantised())["floored_layers"]
    assert float(model.layer1[0].conv2.act_range) == pytest.approx(1e-3)


def _eval_cfg(*overrides):
    return compose(
        [
            "data=fake",
            "model=resnet20",
            "quant.calib_images=8",
            "quant.calib_batch_size=8",
            "quant.bn_recalib=false",
            *overrides,
        ],
        config_name="test",
    )


def test_quantising_for_evaluation_reports_floors_and_follows_the_progress_switch(capfd):
    model = _resnet20()
    with torch.no_grad():
        model.layer1[0].bn1.weight.zero_()
        model.layer1[0].bn1.bias.zero_()
    with pytest.warns(RuntimeWarning, match=r"layer1\.0\.conv2"):
        _, info = quantize_for_eval(model, _eval_cfg("quant.bits=8", "trainer.progress=false"))
    assert "layer1.0.conv2" in info["floored_layers"]
    # no tqdm bar ("calibration:   0%|"); the log line "calibration: activation ranges ..." may reach stderr
    # when an earlier in-process entry point left a logging handler there
    assert not re.search(r"calibration:\s+\d+%", capfd.readouterr().err)


@pytest.mark.parametrize("runtime", ["integer", "layers"])
def test_a_runtime_without_quantisation_is_refused(runtime):
    with pytest.raises(ConfigError, match=f"quant.runtime={runtime} applies to quantised models.*set quant.bits"):
        quantize_for_eval(build_model("resnet20").eval(), _eval_cfg(f"quant.runtime={runtime}"))
    assert quantize_for_eval(model := build_model("resnet20").eval(), _eval_cfg())[1] is None and model is not None
