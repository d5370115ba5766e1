"""test.py end to end on our own checkpoints (no shared data needed): stored config, overrides, clear errors.
Its main() runs in this process; test_quickstart and test_eval_official start it as a process."""

import json

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from addernet.checkpoint import read_checkpoint, save_checkpoint
from addernet.data import build_dataset
from addernet.engine.evaluation import effective_config, evaluate_checkpoint
from addernet.models import build_model
from addernet.test import main as evaluate_main

from helpers import compose, run_main

# data.download=false everywhere: if the stored config were ignored, the default data=cifar10 must not
# reach for the network.
NO_DOWNLOAD = ["data.download=false", "trainer.progress=false"]


def run_test_py(args):
    """test.py's main in this process (the process itself is tested by test_quickstart and test_eval_official)."""
    return run_main(evaluate_main, "test.py", args)


def last_json(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def assert_clean_error(r, *fragments):
    """Non-zero exit, a one-paragraph message naming the problem, no traceback wall."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "test.py: error:" in r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr[-3000:])


@pytest.fixture(scope="module")
def our_checkpoint(tmp_path_factory):
    """A checkpoint in our format (weights + resolved config) of a ResNet-20 CNN on FakeData, and its config."""
    cfg = compose(["model=resnet20", "model.layer=conv", "data=fake", "data.val_size=20", "data.batch_size=8"])
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.manual_seed(0)
    model = build_model("resnet20", layer="conv")
    with torch.no_grad():  # non-trivial BN statistics so that the predictions depend on every tensor
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    save_checkpoint({"format_version": 1, "model": model.state_dict(), "config": config, "epoch": 1}, path)
    return path, model, cfg


def _expected(model, data_cfg):
    """top-1/top-5/loss/n computed here, independently of addernet.engine.evaluation.evaluate."""
    ds = build_dataset(data_cfg, "val")
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    y = torch.tensor([ds[i][1] for i in range(len(ds))])
    model.eval()
    with torch.no_grad():
        logits = model(x)
    top5 = logits.topk(5, 1).indices
    return {
        "top1": 100.0 * (logits.argmax(1) == y).sum().item() / len(ds),
        "top5": 100.0 * (top5 == y[:, None]).any(1).sum().item() / len(ds),
        "loss": F.cross_entropy(logits, y).item(),
        "n": len(ds),
    }


@pytest.mark.slow
def test_rebuilds_model_and_data_from_the_stored_config(our_checkpoint, tmp_path):
    path, model, cfg = our_checkpoint
    results = tmp_path / "out" / "results.json"
    r = run_test_py([f"checkpoint={path}", f"results_file={results}", *NO_DOWNLOAD])
    out = last_json(r)
    want = _expected(model, cfg.data)  # determinism on one machine: test.py and this process, same weights
    assert out["n"] == want["n"] == 20
    assert out["top1"] == pytest.approx(want["top1"], abs=1e-9)
    assert out["top5"] == pytest.approx(want["top5"], abs=1e-9)
    assert out["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert json.loads(results.read_text()) == out
    assert "model resnet20 (conv) | data fake" in r.stdout


@pytest.mark.slow
def test_command_line_overrides_win_over_the_stored_config(our_checkpoint):
    path, model, cfg = our_checkpoint
    out = last_json(run_test_py([f"checkpoint={path}", "data.val_size=7", "data.batch_size=3", *NO_DOWNLOAD]))
    data = OmegaConf.merge(cfg.data, {"val_size": 7})
    want = _expected(model, data)
    assert out["n"] == 7
    assert out["top1"] == pytest.approx(want["top1"], abs=1e-9)
    assert out["loss"] == pytest.approx(want["loss"], rel=1e-5)


def test_effective_config_merges_only_what_the_user_gave():
    stored = {
        "model": {"name": "resnet32", "layer": "adder"},
        "data": {
            "name": "cifar10_folder",
            "root": "/old",
            "train_dir": "/old/train",
            "val_dir": "/old/test",
            "batch_size": 256,
            "num_classes": 10,
        },
    }
    # a data.root override moves the stored (already resolved) folders with it; one key changes in model
    ov = ["checkpoint=x.pt", "data.root=/new", "data.batch_size=50", "model.layer=conv"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert eff.model == {"name": "resnet32", "layer": "conv"}
    assert (eff.data.root, eff.data.train_dir, eff.data.val_dir) == ("/new", "/new/train", "/new/test")
    assert eff.data.batch_size == 50 and eff.data.num_classes == 10
    # an explicit val_dir is kept as given (a key of the stored data option, not of test.yaml's)
    ov = ["checkpoint=x.pt", "data.root=/new", "data.val_dir=/elsewhere"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert (eff.data.train_dir, eff.data.val_dir) == ("/new/train", "/elsewhere")
    # a group choice replaces the stored group with the composed one
    ov = ["checkpoint=x.pt", "data=fake", "model=vgg_small"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert eff.data.name == "fake" and eff.model.name == "vgg_small"
    # a choice equal to the stored one keeps the stored options
    ov = ["checkpoint=x.pt", "data=cifar10_folder"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert {k: eff.data[k] for k in stored["data"]} == stored["data"]
    # nothing given: the stored groups; keys the checkpoint does not record (options newer than it) come from
    # its own option's config file
    ov = ["checkpoint=x.pt"]
    eff = effective_config(compose(ov, config_name="test"), stored, ov)
    assert {k: eff.data[k] for k in stored["data"]} == stored["data"] and eff.model.name == "resnet32"
    assert (eff.data.kind, eff.data.native_size, eff.data.skip_corrupt) == ("folder", 32, False)


@pytest.mark.slow
def test_wrong_architecture_lists_the_keys(our_checkpoint):
    path, _, _ = our_checkpoint
    r = run_test_py([f"checkpoint={path}", "model=resnet32", *NO_DOWNLOAD])
    assert_clean_error(
        r,
        "does not fit the model",
        "missing in the checkpoint (72)",
        "layer1.3.conv1.weight",
        "trained as model=resnet20 model.layer=conv",
    )


@pytest.mark.slow
def test_unsafe_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Payload:  # unpickling this would create `marker`
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    torch.save({"model": Payload(), "config": {}}, path)
    r = run_test_py([f"checkpoint={path}", *NO_DOWNLOAD])
    assert_clean_error(r, "refusing to load", "weights_only")
    assert not marker.exists()


@pytest.mark.slow
def test_truncated_file_gets_a_clear_message(our_checkpoint, tmp_path):
    path, _, _ = our_checkpoint
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert_clean_error(run_test_py([f"checkpoint={cut}", *NO_DOWNLOAD]), "truncated or corrupt")


def test_missing_foreign_and_absent_checkpoints_raise_clear_errors(tmp_path):
    """Same code path as the CLI (main() prints these CheckpointError/ConfigError messages and exits 2)."""
    from addernet.checkpoint import CheckpointError
    from addernet.engine import ConfigError

    with pytest.raises(CheckpointError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "nope.pt")
    other = tmp_path / "other.pt"
    torch.save({"weights": [1, 2], "step": 3}, other)
    with pytest.raises(CheckpointError, match="neither a checkpoint of this repo.*found: weights, step"):
        read_checkpoint(other)
    cfg = compose([], config_name="test")
    with pytest.raises(ConfigError, match=r"no checkpoint given: python test.py checkpoint=PATH"):
        evaluate_checkpoint(cfg, [])
