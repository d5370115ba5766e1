"""Launches that must be refused, leave a run dir as it was, or resume from the run dir alone (docs/reliability.md,
"Run-dir writes on failed launches" and "Resuming from the run dir").
"""

import os
import re
import shlex
import signal
import sys

import pytest
import torch

from addernet.checkpoint import load_checkpoint
from addernet.engine import ConfigError, check_config, model_from_config, train
from addernet.train import main as train_py

from helpers import (
    FAKE,
    TINY_VIT,
    child_env,
    compose,
    metrics_without_timing,
    run_main,
    run_train,
    start_train,
    wait_for_log,
)

# ---- the build's dry run: one logit per class ----


def test_a_model_that_gives_more_logits_than_classes_is_refused():
    """ResNet-20 pools 8x8 and flattens: at 40x40 it ends on 3x3 positions of 10 logits each (90 per image)."""
    ok = compose(["data.image_size=32"])
    check_config(ok)  # the model's own input size: 10 logits for 10 classes
    with pytest.raises(ConfigError) as e:
        check_config(compose(["data.image_size=40"]))
    message = str(e.value)
    assert "\n" not in message and "data.image_size=40" in message and "data.num_classes=10" in message


def test_the_width_check_compares_with_data_num_classes():
    cfg = compose(FAKE + ["data.num_classes=7"])
    check_config(cfg)
    assert model_from_config(cfg)(torch.zeros(2, 3, 28, 28)).shape == (2, 7)


# ---- trainer.precise_bn: a setting that would do nothing ----


def test_precise_bn_on_a_model_without_batchnorm_is_refused_before_the_run_dir_is_written(tmp_path):
    cfg = compose(TINY_VIT + ["trainer.epochs=1", "trainer.progress=false", "trainer.precise_bn=2"])
    model = model_from_config(cfg)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    with pytest.raises(ConfigError, match=r"trainer.precise_bn=2 .* model=vit has no BatchNorm layer"):
        train(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.yaml").exists()
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_the_precise_bn_message_is_a_sentence_whose_example_works():
    with pytest.raises(ConfigError) as e:
        check_config(compose(FAKE + ["trainer.precise_bn=-1"]))
    message = str(e.value)
    assert message.startswith("trainer.precise_bn must be ") and message.endswith(".")
    example = re.search(r"e\.g\. (\S+)\.$", message).group(1)
    assert example.split("=")[0] == "trainer.precise_bn"
    check_config(compose(FAKE + [example]))  # the suggested value is accepted


# ---- a failed launch leaves an existing run dir as it was ----


def _files(run):
    """Every file of a run dir and its bytes, except the append-only train.log and the lock."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name not in ("train.log", ".lock")
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-epoch LeNet-5-BN run launched through train.py (so with Hydra's .hydra/ files)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    proc = run_train(FAKE + ["trainer.epochs=1", f"hydra.run.dir={run}"], env=child_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        (["logger=wandb"], "logger=wandb needs the optional package wandb"),  # the tracker's package
        (["model.layer=conv"], "cannot be resumed with|trained as a different model"),  # the resume check
        (["optim.lr=0.5"], "trained with other settings"),  # a change that needs resume_override
        (["trainer.precise_bn=-1"], "trainer.precise_bn must be"),  # the config check
        (["data.image_size=40"], "cannot take"),  # the model's dry run
    ],
)
def test_a_failed_relaunch_leaves_config_yaml_and_hydra_files_as_they_were(finished_run, change, message, monkeypatch):
    """train.py's main in this process, on a run dir a train.py process wrote."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError: not installed here
    before = _files(finished_run)
    assert {"config.yaml", ".hydra/overrides.yaml", ".hydra/config.yaml", "checkpoints/last.pt"} <= set(before)
    proc = run_main(train_py, "train.py", ["trainer.epochs=2", *change, f"hydra.run.dir={finished_run}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.search(message, proc.stderr), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    after = _files(finished_run)
    assert sorted(after) == sorted(before)
    assert [k for k in before if after[k] != before[k]] == []


# ---- resuming from the run dir alone ----


@pytest.mark.slow
def test_the_printed_resume_command_run_verbatim_resumes_with_the_stored_settings(tmp_path, one_thread):
    """SIGTERM mid-epoch; the command the error prints (nothing but the run dir) resumes the run with its own
    preset and overrides, to exactly the metrics of an uninterrupted run; trainer.resume=<run dir> forks it.
    The interrupted run and the printed command are train.py processes; the reference and the fork run train.py's
    main in this process, with one thread like the processes (child_env)."""
    args = FAKE + ["data.train_size=64", "data.batch_size=8", "trainer.epochs=2", "trainer.deterministic=true"]
    args += ["task.name=helpers.SlowStepTask", "+task.delay=0.2"]  # 8 steps of 0.2 s: time to signal mid-epoch
    reference = run_main(train_py, "train.py", [*args, f"hydra.run.dir={tmp_path / 'reference'}"])
    assert reference.returncode == 0, reference.stderr[-2000:]
    run = tmp_path / "run"
    proc = start_train([*args, f"hydra.run.dir={run}"], env=child_env(), start_new_session=True)
    try:
        wait_for_log(proc, run / "train.log", "epoch 2/2 step 2/8")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read()
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] >= 2
    command = shlex.split(re.search(r"Resume with: (.*)$", err, re.M).group(1))
    assert command[:2] == ["python", "train.py"] and len(command) == 3, command
    forked = tmp_path / "forked"
    fork = run_main(train_py, "train.py", [f"trainer.resume={run}", f"hydra.run.dir={forked}"])
    assert fork.returncode == 0, fork.stderr[-2000:]
    resumed = run_train(command[2:], env=child_env(), script=(sys.executable, command[1]))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    reference = metrics_without_timing(tmp_path / "reference" / "metrics.jsonl")
    assert metrics_without_timing(run / "metrics.jsonl") == reference
    assert metrics_without_timing(forked / "metrics.jsonl") == reference
    assert (run / "config.yaml").read_text() == (tmp_path / "reference" / "config.yaml").read_text()


# ---- where a launch writes: never the current directory by accident, nothing left by a failed first launch ----


@pytest.mark.parametrize("empty", ["hydra.run.dir=", "hydra.run.dir=''", "hydra.run.dir=' '"])
def test_an_empty_run_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch, empty):
    """An unset shell variable (hydra.run.dir=$RUN) would write the run into the current directory."""
    monkeypatch.chdir(tmp_path)
    proc = run_main(train_py, "train.py", [*FAKE, "trainer.epochs=1", empty])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("train.py: error: hydra.run.dir is empty") and proc.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []


def test_an_empty_trainer_resume_is_refused_not_a_fresh_start():
    with pytest.raises(ConfigError, match=r"^trainer.resume is empty .* start from scratch"):
        check_config(compose(FAKE + ["trainer.resume="]))


@pytest.mark.parametrize("where", ["new", "nested", "hydra's default", "existing"])
def test_a_failed_first_launch_removes_what_it_created(tmp_path, monkeypatch, where):
    """A launch that fails on bad data after taking the run dir (.hydra/, .lock, checkpoints/, train.log written)
    removes them: the whole run dir and the folders made for it when it is new, only its own files in a folder
    that existed (the user's files and the folders above stay)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    run = {"new": "runs/run", "nested": "runs/a/b/run", "hydra's default": None, "existing": "runs"}[where]
    (tmp_path / "runs" / "notes.txt").write_text("the user's")
    args = [*FAKE, "trainer.epochs=1", "data.val_size=0"] + ([f"hydra.run.dir={run}"] if run else [])
    proc = run_main(train_py, "train.py", args)
    assert proc.returncode == 2 and "the fake val set is empty" in proc.stderr, proc.stderr[-2000:]
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["runs", "runs/notes.txt"]


def test_a_failed_launch_removes_nothing_while_another_run_holds_the_lock(tmp_path):
    from addernet.engine.rundir import Launch, lock_run_dir

    run = tmp_path / "run"
    launch = Launch([f"hydra.run.dir={run}"])
    lock = lock_run_dir(str(run))  # a second launch into the same new dir took it first
    try:
        launch.remove_created()
        assert (run / ".lock").exists()
    finally:
        lock.close()
    launch.remove_created()
    assert not run.exists()


# ---- the dry run: the input size the model is made for ----


@pytest.mark.parametrize(
    "overrides, takes",
    [
        (["experiment=mnist_lenet5_bn_adder", "data=fake"], "model=lenet5_bn takes 3x28x28 inputs"),  # 32x32 fake
        (FAKE + ["model.adder_layers=all", "data.image_size=32"], "model=lenet5_bn takes 3x28x28 inputs"),
        (FAKE + ["data.image_size=32"], "model=lenet5_bn takes 3x28x28 inputs"),
        (["data=fake", "model=vgg_small", "data.image_size=40"], "model=vgg_small takes 3x32x32 inputs"),
        (["data=fake", "data.image_size=40"], "model=resnet20 takes 3x32x32 inputs"),  # 90 logits per image
        (["data=fake", "data.image_size=4"], "model=resnet20 takes 3x32x32 inputs"),
    ],
)
def test_a_wrong_input_size_is_one_line_naming_the_size_the_model_takes(overrides, takes):
    with pytest.raises(ConfigError) as e:
        check_config(compose(overrides))
    message = str(e.value)
    assert "\n" not in message and takes in message, message
    size = re.search(r"use (data.image_size=\d+)", message).group(1)
    check_config(compose([*overrides, size]))  # the size it names is accepted


def test_a_failed_launch_under_torchrun_leaves_no_empty_dir_of_another_rank(tmp_path, monkeypatch):
    """Each rank's Hydra makes outputs/<date>/<time> of its own second; rank 0's is the run's. A rank > 0 removes
    its own when the launch fails before the run dirs are shared, and only while it is empty."""
    from addernet.engine.rundir import keep_run_dir_on_failure

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    for name, content in (("12-00-01", None), ("12-00-02", "rank 0's train.log")):
        run = tmp_path / "outputs" / "2026-01-01" / name
        run.mkdir(parents=True)
        if content:
            (run / "train.log").write_text(content)
        with pytest.raises(SystemExit), keep_run_dir_on_failure([]) as launch:
            launch.started(str(run))
            sys.exit(2)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "outputs",
        "outputs/2026-01-01",
        "outputs/2026-01-01/12-00-02",
        "outputs/2026-01-01/12-00-02/train.log",
    ]


def test_a_failed_launch_into_an_interpolated_run_dir_keeps_what_was_there(tmp_path, monkeypatch):
    """hydra.run.dir=${oc.env:RUN}: the dir is known once Hydra resolved it; the user's files there stay."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    monkeypatch.setenv("RUN", str(tmp_path / "mine"))
    proc = run_main(train_py, "train.py", [*FAKE, "trainer.epochs=1", "data.val_size=0", "hydra.run.dir=${oc.env:RUN}"])
    assert proc.returncode == 2 and "the fake val set is empty" in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
