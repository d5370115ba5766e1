"""The schema (addernet/config/schema.py): Hydra refuses unknown keys and wrong types in every group and preset,
every entry point reports them in one line with exit 2, and test.py's stored config + command line rule."""

import copy
import json
import re
import subprocess
import sys

import pytest
import torch
from hydra._internal.config_loader_impl import ConfigLoaderImpl  # hydra-core is pinned to 1.3.x
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from addernet.config.validate import check_schema, one_line
from addernet.engine.evaluation import effective_config, stored_model
from addernet.errors import ConfigError

from helpers import FAKE as FAKE_RUN
from helpers import REPO, SHARED, compose, needs_shared, run_entry

PRESETS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
# group -> (a key of every option's schema with a value of the wrong type, the type named in the error)
WRONG_TYPE = {
    "model": ("model.layer=[1,2]", "a string"),
    "data": ("data.batch_size=many", "an integer"),
    "optim": ("optim.lr=fast", "a number"),
    "sched": ("sched.name=[1]", "a string"),
    "trainer": ("trainer.deterministic=maybe", "true or false"),
    "adaptive_lr": ("adaptive_lr.eta=high", "a number"),
    "task": ("task.label_smoothing=some", "a number"),
}
ZOO = REPO / "addernet" / "zoo" / "mnist_lenet5_bn_adder_conv2.pt"  # a zoo file the quantiser handles (Adder2d)


def _refused(overrides, config_name="train"):
    """The one-line error of composing ``overrides`` and checking the composed config against the schema."""
    return _error(lambda: check_schema(compose(overrides, config_name=config_name)), overrides)


def _error(compose_and_check, overrides):
    try:
        compose_and_check()
    except ConfigError as e:
        return str(e)
    except HydraException as e:
        return one_line(e)
    raise AssertionError(f"{overrides} composed without an error")


def _refused_on(cfg, override):
    """_refused(preset + [override]) without composing the preset again: the preset's composed config (struct, as
    Hydra leaves it) gets the override through Hydra's own step of composition for key=value overrides (the
    overrides here choose no group, so the defaults list and everything before that step are the preset's)."""
    cfg = copy.deepcopy(cfg)
    parsed = OverridesParser.create().parse_overrides([override])
    return _error(lambda: (ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg), check_schema(cfg)), [override])


def _assert_group_refuses(group, refused):
    for plus in ("", "+"):  # Hydra's +key= adds to a structured config: refused after composing
        message = refused(f"{plus}{group}.learning_rat=1")
        assert message.startswith(f"unknown key {group}.learning_rat") and "\n" not in message, (group, message)
    override, kind = WRONG_TYPE[group]
    message = refused(override)
    assert message.startswith(override.split("=")[0]) and f"takes {kind}" in message and "\n" not in message


@pytest.mark.parametrize("group", sorted(WRONG_TYPE))
def test_every_group_refuses_an_unknown_key_and_a_wrong_type(group):
    """The whole composition, each bad override given with the default config."""
    _assert_group_refuses(group, lambda override: _refused([override]))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_group_of_every_preset_refuses_an_unknown_key_and_a_wrong_type(preset):
    """Each preset composed once; each bad override applied to it as Hydra's composition applies it."""
    cfg = compose([f"experiment={preset}"])
    assert OmegaConf.is_struct(cfg)
    for group in sorted(WRONG_TYPE):
        _assert_group_refuses(group, lambda override: _refused_on(cfg, override))


def test_the_closest_key_and_option_are_named():
    assert "(did you mean trainer.epochs?)" in _refused(["+trainer.epoch=3"])
    assert "(did you mean data.val_size?)" in _refused(["experiment=quickstart", "data.val_dir=/x"])
    message = _refused(["model=resnet21"])
    assert message.startswith("model=resnet21 is not an option of model (did you mean resnet")
    assert "_torchvision" not in message  # the schemas are no options to choose
    assert _refused(["+epochs=3"]).startswith("unknown key epochs")  # no top-level key of that name


@pytest.mark.parametrize(
    "entry, argv, message",
    [
        ("train", ["+epochs=3"], r"unknown key epochs \(did you mean trainer.epochs\?\): train has no such setting"),
        ("train", ["trainer.epoch=3"], r"unknown key trainer.epoch \(did you mean trainer.epochs\?\)"),
        (
            "train",
            ["model=resnet21"],
            r"model=resnet21 is not an option of model .*choose one of lenet5_bn, .*resnet20",
        ),
        ("train", ["quant.bits=8"], r"unknown key quant: train has no such setting"),
        ("test", ["+result_file=r.json"], r"unknown key result_file \(did you mean results_file\?\)"),
        ("test", ["+quant.bitz=8"], r"unknown key quant.bitz \(did you mean quant.bits\?\)"),
        ("quantize", ["+outt=x.pt"], r"unknown key outt \(did you mean out\?\): quantize has no such setting"),
        ("export_onnx", ["opsett=17"], r"unknown key opsett \(did you mean opset\?\)"),
    ],
)
def test_unknown_keys_and_options_are_one_line(entry, argv, message):
    error = _refused(argv, entry)
    assert "\n" not in error
    assert __import__("re").search(message, error), error


def test_a_task_class_outside_the_package_adds_its_keys():
    from addernet.engine import check_config

    tiny = [*FAKE_RUN, "task.name=helpers.L2PenaltyTask"]
    check_config(compose([*tiny, "+task.weight=0.1"]))  # a key of the class's config_keys
    with pytest.raises(ConfigError, match=r"unknown key task.wieght \(did you mean task.weight\?\)"):
        check_config(compose([*tiny, "+task.wieght=0.1"]))


def test_booleans_are_booleans():
    assert compose(["checkpoint=x.pt", "ema=no"], config_name="test").ema is False
    assert compose(["checkpoint=x.pt", "ema=off"], config_name="test").ema is False
    assert compose(["checkpoint=x.pt", "ema=true"], config_name="test").ema is True


def _run(entry, *args, cwd=None):
    return subprocess.run(
        [sys.executable, str(REPO / entry), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "entry, args, starts",
    [
        ("train.py", ["experiment=quickstart", "data.val_dir=/x"], "unknown key data.val_dir"),
        ("train.py", ["experiment=cifar10_resnet20_cnn", "optim.lr=fast"], "optim.lr (takes a number)"),
        ("train.py", ["logger=null"], "a config group set to null (e.g. logger=null)"),
        ("test.py", [f"checkpoint={ZOO}", "trainer.epochs=abc"], "trainer.epochs (takes an integer)"),
        ("test.py", [f"checkpoint={ZOO}", "data.batch_size=abc"], "data.batch_size (takes an integer)"),
        ("test.py", [f"checkpoint={ZOO}", "data.val_dri=/x"], "unknown key data.val_dri"),
        ("scripts/quantize.py", [f"checkpoint={ZOO}", "out=x.pt", "quant.bitz=8"], "unknown key quant.bitz"),
        ("scripts/export_onnx.py", [f"checkpoint={ZOO}", "out=x.onnx", "opset=x"], "opset (takes an integer)"),
    ],
)
def test_entry_points_report_a_bad_command_line_in_one_line(entry, args, starts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prog = entry.rpartition("/")[2]
    r = run_entry(entry, [*args, f"hydra.run.dir={tmp_path / 'run'}"])  # as `python entry args` runs it
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"{prog}: error: {starts}") and r.stderr.count("\n") == 1, r.stderr


# ---- a checkpoint's stored config + the command line ----
TORCHVISION = {
    "name": "torchvision",
    "layer": "adder",
    "arch": "resnet18",
    "keep_first": True,
    "keep_last": True,
    "linear": False,
    "include": None,
    "exclude": ["layer4.*"],
    "missing_norm": "warn",
}
FAKE = {**OmegaConf.to_container(compose(["data=fake"]).data, resolve=True), "num_classes": 4, "image_size": 32}


@pytest.mark.parametrize("choice", [[], ["model=torchvision"]])
def test_stored_model_options_stay_unless_overridden(choice):
    stored = {"model": TORCHVISION, "data": FAKE}
    ov = ["checkpoint=x.pt", *choice]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert OmegaConf.to_container(eff.model) == TORCHVISION  # model.exclude=[layer4.*] is kept
    assert eff.data.num_classes == 4
    # a key of the stored option (not of a default model) applies on top of the stored options
    ov = ["checkpoint=x.pt", *choice, "model.keep_first=false"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert OmegaConf.to_container(eff.model) == {**TORCHVISION, "keep_first": False}


def test_a_model_override_that_changes_the_stored_layers_is_refused(tmp_path):
    from addernet.models import model_from_config

    config = {"model": TORCHVISION, "data": FAKE}
    model = model_from_config(OmegaConf.create(config))
    path = tmp_path / "tv.pt"
    torch.save({"format_version": 1, "model": model.state_dict(), "config": config, "epoch": 1}, path)
    ov = [f"checkpoint={path}", "model.keep_first=false"]
    with pytest.raises(ConfigError, match=r"trained with conv1 as Conv2d, but this model builds it as Adder2d"):
        stored_model(compose(ov, config_name="test"), ov)
    ov = [f"checkpoint={path}"]
    built, cfg, *_ = stored_model(compose(ov, config_name="test"), ov)
    assert list(cfg.model.exclude) == ["layer4.*"]
    assert type(dict(built.named_modules())["layer4.0.conv1"]).__name__ == "Conv2d"  # excluded: stays a conv
    assert type(dict(built.named_modules())["layer3.0.conv1"]).__name__ == "Adder2d"


def test_a_stored_config_older_than_the_schema_gets_the_options_defaults():
    """The zoo file stores no data.kind (older than that key): the stored data option's own value fills it."""
    ov = [f"checkpoint={ZOO}", "out=x.pt", "quant.bits=8"]
    _, cfg, *_ = stored_model(compose(ov, config_name="quantize"), ov, entry="quantize")
    assert (cfg.data.kind, cfg.data.dataset, cfg.data.name, cfg.model.name) == (
        "torchvision",
        "MNIST",
        "mnist",
        "lenet5_bn",
    )
    assert cfg.data.num_workers == 2  # stored, not mnist.yaml's auto


def test_the_configuration_reference_is_generated_from_the_schema():
    from addernet.config.docs import render

    assert (REPO / "docs" / "configuration.md").read_text() == render(), (
        "docs/configuration.md is stale: python -m addernet.config.docs > docs/configuration.md"
    )


def _reference_tables():
    """(section title, header cells, rows of cells) of every table in docs/configuration.md."""
    title, header, out = None, None, []
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        if line.startswith("## "):
            title, header = line[3:], None
        elif line.startswith("| key |"):
            header = [c.strip() for c in line.strip("|").split("|")]
            out.append((title, header, []))
        elif line.startswith("| `") and header:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            out[-1][2].append(cells)
    return out


def test_every_value_in_the_configuration_reference_is_what_hydra_composes():
    """Each option's column holds what ``group=<option>`` composes to (an entry point's: what it composes to)."""
    parser = OverridesParser.create()
    tables = _reference_tables()
    checked = 0
    for title, header, rows in tables:
        group = re.match(r"`(\w+)`: schema", title)
        for column, option in enumerate(header[2:-1], start=2):
            if group:
                name = group.group(1)
                cfg = compose([f"{name}={option}"], config_name="test" if name == "quant" else "train")
                node = cfg.logger[option] if name == "logger" else cfg[name]
            else:
                node = compose([], config_name=option)
            values = OmegaConf.to_container(node, resolve=False)
            for cells in rows:
                key, kind, cell = cells[0].strip("`"), cells[1], cells[column].strip("`")
                if kind == "Any" and not group:
                    continue  # an entry point's group: the option it chooses
                assert parser.parse_override(f"x={cell}").value() == values[key], (title, option, key, cell)
                checked += 1
    assert checked > 200 and {t for t, _, _ in tables} >= {"`optim`: schema `adamw`", "`trainer`: schema `trainer`"}


@pytest.mark.slow
@needs_shared("mnist/MNIST/raw")
def test_quantize_py_reads_the_zoo_file_as_test_py_does(tmp_path):
    out = tmp_path / "q.pt"
    args = [f"checkpoint={ZOO}", f"out={out}", "quant.bits=8", "quant.calib_images=256", "trainer.progress=false"]
    r = _run("scripts/quantize.py", *args, f"data.root={SHARED / 'mnist'}", "data.download=false")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["bits"] == 8 and out.is_file()


@pytest.mark.slow
def test_load_quantized_rebuilds_a_torchvision_model_with_its_stored_options(tmp_path):
    from addernet.models import model_from_config
    from addernet.quant import load_quantized, quantize_for_eval, save_quantized

    data = {**FAKE, "train_size": 16, "batch_size": 8, "num_workers": 0, "pin_memory": False}
    quant = {"bits": 8, "calib_images": 16, "calib_batch_size": 8, "bn_recalib": False}
    cfg = compose(["data=fake", "model=torchvision", *(f"quant.{k}={v}" for k, v in quant.items())], "test")
    cfg = OmegaConf.merge(cfg, {"model": TORCHVISION, "data": data, "trainer": {"progress": False}})
    model, _ = quantize_for_eval(model_from_config(cfg).eval(), cfg)
    path = tmp_path / "q.pt"
    config = {"model": TORCHVISION, "data": data}
    save_quantized(path, model, config, {"bits": 8, "groups": 4})
    loaded = load_quantized(path, runtime="layers")
    kinds = {n: type(m).__name__ for n, m in loaded.named_modules()}
    assert kinds["layer4.0.conv1"] == "Conv2d" and kinds["layer3.0.conv1"] != "Conv2d"  # exclude=[layer4.*] kept
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(loaded(x), model(x), atol=1e-4)
