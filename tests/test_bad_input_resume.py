"""Resume never loses or misattributes a run's work: which checkpoint a run resumes from, which settings may
change on resume, checkpoints whose fields were edited or damaged, one run per run dir, interrupted writes
(docs/reliability.md, "Resume").

Tiny in-process runs: LeNet-5-BN on 28x28 FakeData, one or two epochs of a few steps; one train.py pair.
"""

import errno
import json
import math
import os
import signal

import pytest
import torch
from omegaconf import OmegaConf

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from addernet.engine import ConfigError, fit, rundir, train
from addernet.engine.evaluation import evaluate_checkpoint

from helpers import FAKE, compose, metrics_without_timing, preempt_at, run_train, start_train, wait_for_log

EXACT_RUN = [*FAKE, "trainer.deterministic=true"]  # the tiny run, bit for bit reproducible


def _run(tmp_path, *extra, name="run"):
    run = tmp_path / name
    train(compose(EXACT_RUN + list(extra)), str(run))
    return run


def _log(run):
    return (run / "train.log").read_text()


def test_history_without_last_pt_is_refused_and_best_pt_is_offered(tmp_path):
    run = _run(tmp_path, "trainer.epochs=1")
    (run / "checkpoints" / "last.pt").unlink()  # deleted, or a disk-full first save of last.pt
    best, metrics = run / "checkpoints" / "best.pt", run / "metrics.jsonl"
    kept = best.read_bytes(), metrics.read_text()
    with pytest.raises(
        ConfigError,
        match=r"holds a run's history .*best.pt.*metrics.jsonl.* but no checkpoints/"
        r"last.pt.*trainer.resume=.*best.pt.*fresh dir",
    ):
        train(compose(EXACT_RUN + ["trainer.epochs=2"]), str(run))
    assert (best.read_bytes(), metrics.read_text()) == kept
    # the offered choice: resume from best.pt; its history is kept and the run continues at epoch 2
    train(compose(EXACT_RUN + ["trainer.epochs=2", f"trainer.resume={best}"]), str(run))
    lines = metrics.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == kept[1].splitlines()[0]


def test_metrics_alone_is_a_history_too(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl\) but no checkpoints/last.pt.*delete"):
        train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))
    assert (run / "metrics.jsonl").read_text() == '{"epoch": 1}\n'


def test_the_runs_own_last_pt_wins_over_trainer_resume(tmp_path):
    source = _run(tmp_path, "trainer.epochs=1", name="source")
    command = EXACT_RUN + ["trainer.epochs=2", f"trainer.resume={source / 'checkpoints' / 'last.pt'}"]
    run = tmp_path / "requeued"
    train(compose(command), str(run))
    first = metrics_without_timing(run / "metrics.jsonl")
    train(compose(command), str(run))  # the same command again (a re-queued job)
    log = _log(run)
    assert "wins over trainer.resume" in log
    assert f"resumed from {run / 'checkpoints' / 'last.pt'}: 2 epoch(s) done" in log
    assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 2
    # determinism on one machine: runs made in this test, bit for bit
    assert metrics_without_timing(run / "metrics.jsonl") == first


def test_changed_settings_are_refused_with_the_keys_and_config_yaml_is_kept(tmp_path):
    run = _run(tmp_path, "trainer.epochs=1")
    before = (run / "config.yaml").read_text()
    with pytest.raises(
        ConfigError,
        match=r"other settings \(data.batch_size, optim.lr, optim.weight_decay, "
        r"trainer.seed differ\).*optim.lr=0.05 \(the checkpoint's: 0.1\).*"
        r"trainer.resume_override=true",
    ):
        train(
            compose(
                EXACT_RUN
                + ["trainer.epochs=2", "optim.lr=0.05", "optim.weight_decay=0", "trainer.seed=7", "data.batch_size=8"]
            ),
            str(run),
        )
    assert (run / "config.yaml").read_text() == before
    assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 1


def test_settings_that_may_change_are_applied_and_logged(tmp_path):
    run = _run(tmp_path, "trainer.epochs=1")
    train(compose(EXACT_RUN + ["trainer.epochs=2", "trainer.log_every=3", "trainer.hist_every=5"]), str(run))
    assert "applied from here on: trainer.epochs=2 (the checkpoint's: 1), trainer.hist_every=5" in _log(run)
    stored = OmegaConf.load(run / "config.yaml")
    assert (stored.trainer.log_every, stored.trainer.hist_every) == (3, 5)


def test_resume_override_applies_the_new_optimizer_settings(tmp_path):
    run = _run(tmp_path, "trainer.epochs=1")
    train(
        compose(
            EXACT_RUN + ["trainer.epochs=2", "optim.lr=0.05", "optim.weight_decay=0", "trainer.resume_override=true"]
        ),
        str(run),
    )
    records = metrics_without_timing(run / "metrics.jsonl")
    # epoch 2 of a 2-epoch cosine run started at lr 0.05: 0.05 * (1 + cos(pi / 2)) / 2
    assert records[1]["lr"] == pytest.approx(0.05 * (1 + math.cos(math.pi / 2)) / 2, abs=1e-12)
    groups = load_checkpoint(run / "checkpoints" / "last.pt")["optimizer"]["param_groups"]
    assert all(g["weight_decay"] == 0 and g["initial_lr"] == 0.05 for g in groups)
    assert OmegaConf.load(run / "config.yaml").optim.lr == 0.05


def test_mid_epoch_batch_size_change_continues_after_the_images_seen(tmp_path, monkeypatch):
    args = EXACT_RUN + ["trainer.epochs=1", "data.train_size=48", "data.batch_size=8"]
    run = tmp_path / "run"
    preempt_at(args, "epoch 1/1 step 2/6", run)
    seen = []
    real = fit.Run.end_epoch
    monkeypatch.setattr(
        fit.Run, "end_epoch", lambda self, e, r: (seen.append(self.sums.compute()["n"]), real(self, e, r))
    )
    train(compose(args + ["data.batch_size=16", "trainer.resume_override=true"]), str(run))
    assert "continues after the 16 images it already trained on, at step 1" in _log(run)
    assert seen == [48]  # every training image exactly once: 2 steps of 8, then 2 steps of 16


def _teacher(tmp_path, name):
    return _run(tmp_path, "trainer.epochs=1", "model.layer=conv", name=name) / "checkpoints" / "last.pt"


def test_changing_the_kd_teacher_is_refused_even_with_override(tmp_path):
    one, two = _teacher(tmp_path, "t1"), _teacher(tmp_path, "t2")
    run = _run(tmp_path, "trainer.epochs=1", "task=kd", f"task.teacher={one}")
    with pytest.raises(
        ConfigError,
        match=r"cannot be resumed with task.teacher=.*t2.*not even with "
        r"trainer.resume_override",
    ):
        train(
            compose(EXACT_RUN + ["trainer.epochs=2", "task=kd", f"task.teacher={two}", "trainer.resume_override=true"]),
            str(run),
        )


def test_switching_optimizer_on_resume_is_one_line(tmp_path):
    run = _run(tmp_path, "trainer.epochs=1")
    with pytest.raises(ConfigError, match=r"cannot be resumed with optim.name=adamw \(the checkpoint's: sgd\)"):
        train(compose(EXACT_RUN + ["trainer.epochs=2", "optim=adamw"]), str(run))
    # a checkpoint whose stored config was edited to claim AdamW still holds SGD's state
    last = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    ckpt["config"]["optim"] = OmegaConf.to_container(compose(EXACT_RUN + ["optim=adamw"]).optim)
    save_checkpoint(ckpt, last)
    with pytest.raises(
        CheckpointError,
        match=r"holds the state of another optimizer .*momentum.* than this run's "
        r"AdamW",
    ):
        train(compose(EXACT_RUN + ["trainer.epochs=2", "optim=adamw"]), str(run))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("format_version", "1", r"format_version '1', which is not a version"),
        ("format_version", 99, r"format_version 99, newer than this code's 1"),
        ("epoch", -1, r"epoch must be an integer >= 0, found -1"),
        ("epoch", 2.0, r"epoch must be an integer >= 0, found 2.0"),
        ("epoch", 3, r"history holds 1 epoch record\(s\) but epoch is 3"),
        ("history", None, r"history must be a list of epoch records, found None"),
        ("config", ["x"], r"config must be a dict \(the resolved config\), found a list of 1"),
        ("optimizer", {}, r"optimizer must be an optimizer state_dict"),
        ("step", 2, r"mid-epoch checkpoint \(step > 0\) must hold one RNG state per process"),
    ],
)
def test_hand_edited_checkpoint_fields_are_one_line(tmp_path, finished_tiny_run, field, value, message):
    run = finished_tiny_run
    edited = tmp_path / "edited.pt"
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    ckpt[field] = value
    save_checkpoint(ckpt, edited)
    with pytest.raises(CheckpointError, match=message) as e:
        train(compose(EXACT_RUN + ["trainer.epochs=2", f"trainer.resume={edited}"]), str(tmp_path / "resumed"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "value, message",
    [("x", "format_version 'x', which is not a version"), (2, "format_version 2, newer than this code's 1")],
)
def test_test_py_checks_format_version_like_resume(tmp_path, finished_tiny_run, value, message):
    run = finished_tiny_run
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    ckpt["format_version"] = value
    edited = tmp_path / "edited.pt"
    save_checkpoint(ckpt, edited)
    args = [f"checkpoint={edited}", "trainer.progress=false"]
    with pytest.raises(CheckpointError, match=message):
        evaluate_checkpoint(compose(args, config_name="test"), args)


# --- a resume with a different model or schedule --------------------------------------------------------------------


def test_resume_with_the_other_layer_is_refused_and_keeps_the_config(tmp_path):
    run = tmp_path / "run"
    train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"last.pt was trained as a different model: model.layer=conv"):
        train(compose(EXACT_RUN + ["trainer.epochs=2", "model.layer=conv"]), str(run))
    assert (run / "config.yaml").read_text() == before


# --- resuming with more epochs recomputes the schedule --------------------------------------------------------------


def test_resume_with_more_epochs_continues_the_schedule_of_the_new_length(tmp_path):
    run = tmp_path / "run"
    train(compose(EXACT_RUN + ["trainer.epochs=2"]), str(run))
    train(compose(EXACT_RUN + ["trainer.epochs=3"]), str(run))
    lrs = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    cosine = [0.1 * (1 + math.cos(math.pi * e / 2)) / 2 for e in (0, 1)] + [0.1 * (1 + math.cos(math.pi * 2 / 3)) / 2]
    assert lrs == pytest.approx(cosine, abs=1e-12) and lrs[2] == pytest.approx(0.025)
    assert "trainer.epochs changed from 2 (the checkpoint's) to 3" in (run / "train.log").read_text()
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 3 and ckpt["config"]["trainer"]["epochs"] == 3
    assert OmegaConf.load(run / "config.yaml").trainer.epochs == 3


# --- one run per run dir --------------------------------------------------------------------------------------------


def test_a_locked_run_dir_fails_at_once_and_is_left_alone(tmp_path):
    run = tmp_path / "run"
    holder = rundir.lock_run_dir(str(run))  # what a live run holds
    try:
        with pytest.raises(
            rundir.RunDirBusy, match=f"run dir {run} is in use by another training run \\(pid {os.getpid()}"
        ):
            train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))
        assert sorted(os.listdir(run)) == [".lock"]  # no train.log, config.yaml or checkpoints written
    finally:
        holder.close()
    train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))  # released: the next run goes ahead


@pytest.mark.slow
def test_concurrent_train_py_in_one_run_dir(tmp_path):
    run = tmp_path / "run"
    args = EXACT_RUN + ["data.train_size=64", "data.batch_size=8", "trainer.epochs=2", f"hydra.run.dir={run}"]
    first = start_train(args)
    try:
        wait_for_log(first, run / "train.log", "epoch 1/2 step 1/8")
        first.send_signal(signal.SIGSTOP)  # frozen mid-run, lock held: the second run cannot win a race
        try:
            second = run_train(args, timeout=120)
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 2 and "is in use by another training run" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2]


# --- interrupted writes: stale temporaries, a full disk -------------------------------------------------------------


def test_stale_tmp_files_are_removed_at_start(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    stale = [run / "checkpoints" / ".last.pt.k3j2.tmp", run / "metrics.jsonl.tmp"]
    for p in stale:
        p.write_bytes(b"half a write")
    train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))
    assert not any(p.exists() for p in stale)
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pt", "last.pt"]
    assert "removed 2 temporary file(s) of an interrupted write" in (run / "train.log").read_text()


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(compose(EXACT_RUN + ["trainer.epochs=1"]), str(run))
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    monkeypatch.setattr(torch, "save", _disk_full)
    with pytest.raises(
        CheckpointError,
        match=f"cannot write checkpoint {run}/checkpoints/(best|last).pt: no space "
        f"left on device; the previous (best|last).pt is intact",
    ):
        train(compose(EXACT_RUN + ["trainer.epochs=2"]), str(run))
    monkeypatch.undo()
    assert last.read_bytes() == before and sorted(os.listdir(last.parent)) == ["best.pt", "last.pt"]


# ---- what a resume replays: the launch record or the checkpoint's config, never a one-shot permission ----


def _train_py(*args):
    from addernet.train import main as train_py

    from helpers import run_main

    return run_main(train_py, "train.py", [str(a) for a in args])


def test_resume_override_is_not_replayed_by_a_later_resume(tmp_path):
    """trainer.resume_override=true lets that launch change settings; a later resume of the run dir alone compares
    with the checkpoint again and refuses a change, also where the launch record holds the permission."""
    run = tmp_path / "run"
    first = _train_py(*FAKE, "trainer.epochs=1", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    override = _train_py(f"hydra.run.dir={run}", "trainer.epochs=2", "optim.lr=0.05", "trainer.resume_override=true")
    assert override.returncode == 0, override.stderr[-2000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["config"]["optim"]["lr"] == 0.05
    recorded = OmegaConf.load(run / ".hydra" / "overrides.yaml")
    assert "optim.lr=0.05" in recorded and not [o for o in recorded if "resume_override" in o]
    (run / ".hydra" / "overrides.yaml").write_text(  # a record that holds it (written by an older version)
        OmegaConf.to_yaml(OmegaConf.create([*recorded, "trainer.resume_override=true"]))
    )
    kept = (run / "config.yaml").read_text()
    later = _train_py(f"hydra.run.dir={run}", "optim.lr=0.5", "trainer.seed=7", "trainer.epochs=3")
    assert later.returncode == 2, later.stderr[-2000:]
    assert "trained with other settings (optim.lr, trainer.seed differ)" in later.stderr
    assert "Traceback" not in later.stderr and (run / "config.yaml").read_text() == kept


def test_a_run_without_its_launch_record_resumes_from_its_checkpoints_config(tmp_path):
    """A run dir without .hydra/overrides.yaml (copied without it, or trained through the API): trainer.resume=<its
    checkpoint> and hydra.run.dir=<it> resume with the config stored in the checkpoint, not the default
    ResNet-20/CIFAR-10 config; what the command line gives wins."""
    run = _run(tmp_path, "trainer.epochs=1", "optim.lr=0.05", "data.train_size=48", "model.layer=conv")
    assert not (run / ".hydra").exists()
    fork = tmp_path / "fork"
    forked = _train_py(f"trainer.resume={run / 'checkpoints' / 'last.pt'}", f"hydra.run.dir={fork}", "trainer.epochs=2")
    assert forked.returncode == 0, forked.stderr[-2000:]
    assert f"resuming with the config stored in {run / 'checkpoints' / 'last.pt'} (model=lenet5_bn" in forked.stderr
    stored, continued = (OmegaConf.load(d / "config.yaml") for d in (run, fork))
    assert continued.trainer.epochs == 2 and continued.trainer.resume == str(run / "checkpoints" / "last.pt")
    for node in (stored, continued):
        node.trainer.epochs, node.trainer.resume = 0, None
    assert continued == stored
    assert [r["epoch"] for r in map(json.loads, (fork / "metrics.jsonl").read_text().splitlines())] == [1, 2]
    resumed = _train_py(f"hydra.run.dir={run}", "trainer.epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert metrics_without_timing(run / "metrics.jsonl") == metrics_without_timing(fork / "metrics.jsonl")


def test_the_overrides_of_a_stored_config_compose_it_again():
    """Values Hydra's grammar would misread unquoted (=, a comma, a quote, a string that reads as a number or null),
    float forms (1e-05), list groups and a task class's own keys come back as they were."""
    cfg = compose(
        FAKE
        + ["data.root='/data/a=b,c\\'\"d'", "trainer.device='1'", "optim.weight_decay=1e-05", "data.std=[0.25]"]
        + ["data.mean=[0.5]", "data.in_channels=1", "sched=cosine_warmup", "logger=[tensorboard,mlflow]"]
        + ["task.name=helpers.SlowStepTask", "+task.delay=0.2"]  # a task class's own key, outside the schema
    )
    stored = OmegaConf.to_container(cfg, resolve=True)
    assert stored["data"]["root"] == "/data/a=b,c'\"d" and stored["trainer"]["device"] == "1"
    again = OmegaConf.to_container(compose(rundir.config_overrides(stored)), resolve=True)
    assert again == stored


def test_a_run_dir_whose_path_needs_quotes_resumes_from_the_printed_form(tmp_path):
    """A sweep job's dir (1_optim.lr=0.05,trainer.seed=1) has = and , in its path: the form a stopped run prints
    (shell_override) resumes it with its recorded overrides, and a failed relaunch there keeps its .hydra/."""
    import shlex

    from addernet.config.entry import shell_override

    run = tmp_path / "1_optim.lr=0.05,trainer.seed=1"
    given = shlex.split(shell_override("hydra.run.dir", str(run)))
    assert given == [f'hydra.run.dir="{run}"']
    first = _train_py(*FAKE, "trainer.epochs=1", "optim.lr=0.05", *given)
    assert first.returncode == 0 and (run / "checkpoints" / "last.pt").exists(), first.stderr[-2000:]
    recorded = (run / ".hydra" / "overrides.yaml").read_text()
    refused = _train_py(*given, "trainer.epochs=2", "optim.lr=0.5")
    assert refused.returncode == 2 and "trained with other settings (optim.lr differ)" in refused.stderr
    assert (run / ".hydra" / "overrides.yaml").read_text() == recorded
    resumed = _train_py(*given, "trainer.epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming with the run dir's recorded overrides: " in resumed.stderr
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2]
