"""Atomic save and safe load of checkpoints."""

import collections
import os

import pytest
import torch

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _state():
    return {
        "model": collections.OrderedDict(w=torch.arange(6.0).view(2, 3)),
        "epoch": 3,
        "best_top1": 12.5,
        "history": [{"epoch": 1, "val_top1": 1.0}],
        "rng": {"python": (3, tuple(range(5)), None)},
        "config": {"trainer": {"seed": 0}},
    }


def test_round_trip_with_plain_containers(tmp_path):
    path = save_checkpoint(_state(), tmp_path / "sub" / "last.pt")
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], _state()["model"]["w"])
    assert {k: v for k, v in loaded.items() if k != "model"} == {k: v for k, v in _state().items() if k != "model"}
    assert os.listdir(tmp_path / "sub") == ["last.pt"]  # no temporary file left behind


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)

    def crash(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # e.g. interrupted halfway through writing

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path) == {"epoch": 1} and os.listdir(tmp_path) == ["last.pt"]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_file_is_reported(tmp_path, keep):
    path = save_checkpoint(_state(), tmp_path / "last.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path)


class Payload:  # arbitrary objects are what weights_only refuses
    pass


def test_unsafe_pickle_is_refused_with_advice(tmp_path):
    path = tmp_path / "unsafe.pt"
    torch.save({"obj": Payload()}, path)
    with pytest.raises(CheckpointError, match="refusing to load .*weights_only=False only if you trust"):
        load_checkpoint(path)
