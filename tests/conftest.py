"""pytest fixtures shared by the test modules (plain helpers are in helpers.py)."""

import pytest
import torch

from addernet.engine import train

from helpers import FAKE, OFFICIAL_R20, compose, run_train, write_jpeg_folder


@pytest.fixture
def jpeg_cifar(tmp_path_factory):
    """A small cifar10_folder tree: train/ (4 classes x 12 JPEGs) and test/ (37 JPEGs: an odd count)."""
    root = tmp_path_factory.mktemp("jpeg_cifar")
    write_jpeg_folder(root / "train", 12, seed=1)
    write_jpeg_folder(root / "test", 9, seed=2)
    (root / "test" / "automobile" / "extra.jpg").write_bytes((root / "test" / "airplane" / "0.jpg").read_bytes())
    return root


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (hundreds of tiny ops run fastest so on a loaded machine); restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cfg_train():
    """The tiny-run config: train.yaml composed with helpers.FAKE, typed by the schema (a wrong type or an unknown
    key is refused on assignment). Each test gets its own copy to change (``cfg_train.trainer.epochs = 2``,
    ``OmegaConf.merge``, ``open_dict`` for keys a plug-in adds) and pass to ``addernet.engine.train(cfg, run_dir)``
    or to ``tiny_run()``. Group choices (``model=...``) need composing: give them to ``tiny_run`` as overrides."""
    return compose(FAKE)


@pytest.fixture
def tiny_run(tmp_path, cfg_train):
    """Train a tiny run in-process into tmp_path/name and return that run dir: ``tiny_run(name="run")`` trains
    cfg_train as the test changed it; ``tiny_run(*overrides)`` composes helpers.FAKE with the overrides instead."""

    def run(*overrides, name="run"):
        path = tmp_path / name
        train(compose(FAKE + list(overrides)) if overrides else cfg_train, str(path))
        return path

    return run


@pytest.fixture(scope="session")
def official_r20():
    """The official ResNet-20 AdderNet checkpoint in ../shared; the test is skipped where it is absent."""
    if not OFFICIAL_R20.is_file():
        pytest.skip(f"official checkpoint {OFFICIAL_R20} absent: ../shared is not part of a user's clone")
    return OFFICIAL_R20


@pytest.fixture(scope="session")
def converted_r20(tmp_path_factory, official_r20):
    """The official ResNet-20 converted once by scripts/convert_official.py into this repo's checkpoint format
    (a subprocess: tests using it are slow); skipped where the official checkpoint is absent."""
    out = tmp_path_factory.mktemp("converted") / "resnet20_official.pt"
    r = run_train([str(official_r20), str(out)], script=("scripts/convert_official.py",), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory):
    """One finished tiny run (helpers.FAKE, one deterministic epoch), shared by the tests that only read it: its
    checkpoints, metrics.jsonl and config.yaml must not be changed."""
    run = tmp_path_factory.mktemp("finished_tiny_run") / "run"
    train(compose(FAKE + ["trainer.epochs=1", "trainer.deterministic=true"]), str(run))
    return run
