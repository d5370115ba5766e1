"""Pre-emption within a step, whatever the step rate and trainer.log_every; a stalled torchrun rank stops the job
with a message instead of a silent 30-minute wait (docs/reliability.md, "Pre-emption and Ctrl-C").

The stop flag is read after every step (one process) or voted on without a device synchronisation (torchrun);
tests/helpers.py's SlowStepTask makes steps slow, sends SIGTERM in a given step, or stalls one rank.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from addernet.checkpoint import load_checkpoint
from addernet.engine import Preempted, train
from helpers import REPO, SlowStepTask, compose, metrics_without_timing, run_train

# trainer.log_every stays at its default (50): more than the steps of an epoch here
FAKE = ["data=fake", "data.train_size=64", "data.val_size=8", "data.batch_size=8", "model=lenet5_bn",
        "data.image_size=28", "trainer.progress=false", "data.num_workers=0", "data.pin_memory=false",
        "trainer.deterministic=true", "task.name=helpers.SlowStepTask"]
ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}


def test_sigterm_is_honoured_at_the_next_step_not_the_next_log_line(tmp_path, monkeypatch):
    assert compose(FAKE).trainer.log_every == 50
    train(compose(FAKE + ["trainer.epochs=2"]), str(tmp_path / "reference"))
    monkeypatch.setattr(SlowStepTask, "steps", 0)
    run = tmp_path / "run"
    with pytest.raises(Preempted, match=r"stopped by SIGTERM at epoch 2 step 3; saved"):
        train(compose(FAKE + ["trainer.epochs=2", "+task.sigterm_step=11"]), str(run))  # step 3 of epoch 2
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"]) == (1, 3)
    train(compose(FAKE + ["trainer.epochs=2", "+task.sigterm_step=11"]), str(run))  # resumes: no 11th step now
    assert metrics_without_timing(run / "metrics.jsonl") == metrics_without_timing(tmp_path / "reference" /
                                                                                   "metrics.jsonl")


def _wait_for(path, text, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ended before {text!r}: {proc.stderr.read()[-3000:]}")
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.slow
def test_slow_steps_with_the_default_log_every_save_mid_epoch_on_sigterm(tmp_path):
    """One second per step and log_every=50: the SIGTERM is honoured after the current step, not 50 steps later."""
    run = tmp_path / "run"
    args = FAKE + ["data.train_size=400", "trainer.epochs=1", "+task.delay=1.0", f"hydra.run.dir={run}"]
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV}, start_new_session=True)
    try:
        _wait_for(run / "train.log", "data fake:", proc)
        time.sleep(2.5)  # a few slow steps in
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 0 and 1 <= ckpt["step"] < 10  # the step the signal came in, far before step 50
    assert f"stopped by SIGTERM at epoch 1 step {ckpt['step']}" in proc.stderr.read()


def _torchrun(tmp_path, *args, timeout=240):
    return run_train(list(args), script=("bash", "scripts/dist_train.sh", "2"), timeout=timeout,
                     env={**ENV, "PYTHON": sys.executable, "RUN_DIR": str(tmp_path / "run"),
                          "MASTER_PORT": str(29500 + os.getpid() % 1000)})


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_ranks_agree_on_a_sigterm_at_the_same_step(tmp_path):
    """Only rank 0 gets the signal here; the vote stops both ranks at one step, and rank 0 saves it."""
    proc = _torchrun(tmp_path, *FAKE, "data.batch_size=8", "trainer.epochs=1", "+task.sigterm_step=3",
                     "+task.delay=0.2")
    assert proc.returncode != 0
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and ckpt["step"] in (3, 4) and len(ckpt["rng"]) == 2
    assert f"stopped by SIGTERM at epoch 1 step {ckpt['step']}" in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_a_stalled_rank_stops_the_job_after_the_timeout_with_a_message(tmp_path):
    proc = _torchrun(tmp_path, *FAKE, "trainer.epochs=1", "trainer.dist_timeout=5", "+task.stall_rank=1",
                     "+task.stall_step=2", "+task.stall_seconds=15")
    assert proc.returncode != 0
    assert "another rank stalled or died" in proc.stderr and "trainer.dist_timeout=5 s" in proc.stderr
    assert "another rank stalled or died" in (tmp_path / "run" / "train.log").read_text()
