"""pytest fixtures shared by the test modules (plain helpers are in helpers.py)."""

import logging
import os

import pytest
import torch

from addernet.engine import train

from helpers import FAKE, OFFICIAL_R20, compose, run_train, write_jpeg_folder

# Tests that share an expensive module or session fixture (built once per worker process), by node id prefix:
# with -n N each group runs on one worker, which builds the fixture once; every other test goes to whichever
# worker is free, as in xdist's default load mode. (Under pytest 9, xdist's own --dist loadgroup ignores its
# xdist_group marks.)
SAME_WORKER = {
    "tests/test_quant_official.py::": "quantised official ResNet-20",
    "tests/test_eval_official.py::": "official ResNet-20 evaluated and converted",
    "tests/test_bad_input_inputs.py::test_converted_official_checkpoint_as_conv_is_refused": (
        "official ResNet-20 evaluated and converted"
    ),
    "tests/test_quant_intnet.py::": "quantised random ResNet-20s",
    "tests/test_kernel_paths.py::test_integer_network_equals_the_float64_reference_on_every_split": (
        "quantised random ResNet-20s"
    ),
    "tests/test_bad_input_launch.py::test_a_failed_relaunch_leaves": "a finished train.py run",
    "tests/test_triton.py::test_interpreter_": "the Triton interpreter's run of the kernels",
}


def pytest_configure(config):
    """With -n N, each worker process computes on its share of the cores (torch's threads // N, at least one). Two
    workers that each run an OpenMP team as wide as the machine keep taking each other's cores: OpenMP's threads
    spin while they wait, and a training loop of small ops runs ten times slower (a learning test beside another
    took 52 s instead of 4 s). The processes a test starts inherit the same count (OMP_NUM_THREADS), so a run
    in this process and one in a child compute alike: a float32 sum split across another number of threads rounds
    differently."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        threads = max(1, torch.get_num_threads() // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def pytest_xdist_make_scheduler(config, log):
    """xdist's load mode (the default of -n N) with the SAME_WORKER groups kept on one worker."""
    if config.getvalue("dist") != "load":
        return None  # another --dist mode asked for explicitly
    from xdist.scheduler import LoadScopeScheduling

    class SameWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return next((group for prefix, group in SAME_WORKER.items() if nodeid.startswith(prefix)), nodeid)

    return SameWorkerGroups(config, log)


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """Logging configuration put back after each test. An entry point run in this process (Hydra's job logging:
    handlers on the root logger, levels, disabled loggers) would otherwise send later tests' log records to its
    handlers, as a new process never does."""
    loggers = [logging.root, *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    state = [(lg, lg.handlers[:], lg.level, lg.disabled, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, disabled, propagate in state:
        lg.handlers[:], lg.level, lg.disabled, lg.propagate = handlers, level, disabled, propagate


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
