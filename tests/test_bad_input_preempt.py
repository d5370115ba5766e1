"""Pre-emption within a step, whatever the step rate and trainer.log_every; SIGTERM / Ctrl-C to the whole process
group (DataLoader workers too) saves mid-epoch; a stalled torchrun rank stops the job with a message instead of
a silent 30-minute wait (docs/reliability.md, "Pre-emption and Ctrl-C").

The stop flag is read after every step (one process) or voted on without a device synchronisation (torchrun);
tests/helpers.py's SlowStepTask makes steps slow, sends SIGTERM in a given step, or stalls one rank.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from addernet.checkpoint import load_checkpoint
from addernet.data import build_loader
from addernet.engine import Preempted, train
from addernet.engine.resume import StopFlag

from helpers import (
    FAKE,
    REPO,
    SlowStepTask,
    child_env,
    compose,
    folder_run,
    metrics_without_timing,
    run_train,
    start_train,
    wait_for_log,
)

# the tiny run in 8 steps of 8 an epoch, with SlowStepTask; a log line (and host check) only every 50 steps, more
# than an epoch here
SLOW_RUN = [
    *FAKE,
    "data.train_size=64",
    "data.batch_size=8",
    "trainer.log_every=50",
    "trainer.deterministic=true",
    "task.name=helpers.SlowStepTask",
]


@pytest.mark.slow  # three runs, about 30 steps
def test_sigterm_is_honoured_at_the_next_step_and_resumes_from_an_explicit_path(tmp_path, monkeypatch):
    """log_every=50 > the steps of an epoch: the stop comes at the next step; trainer.resume=<its last.pt> in a new
    run dir then continues mid-epoch to exactly the metrics of an uninterrupted run."""
    train(compose(SLOW_RUN + ["trainer.epochs=2"]), str(tmp_path / "reference"))
    monkeypatch.setattr(SlowStepTask, "steps", 0)
    run = tmp_path / "run"
    with pytest.raises(Preempted, match=r"stopped by SIGTERM at epoch 2 step 3; saved .*last.pt"):
        train(compose(SLOW_RUN + ["trainer.epochs=2", "+task.sigterm_step=11"]), str(run))  # step 3 of epoch 2
    last = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    assert (ckpt["epoch"], ckpt["step"]) == (1, 3)
    train(
        compose(SLOW_RUN + ["trainer.epochs=2", "+task.sigterm_step=11", f"trainer.resume={last}"]),
        str(tmp_path / "new"),
    )  # the same command: step 11 is behind the counter now
    # determinism on one machine: runs made in this test, bit for bit
    assert metrics_without_timing(tmp_path / "new" / "metrics.jsonl") == metrics_without_timing(
        tmp_path / "reference" / "metrics.jsonl"
    )


@pytest.mark.slow
def test_slow_steps_with_the_default_log_every_save_mid_epoch_on_sigterm(tmp_path):
    """One second per step and log_every=50: the SIGTERM is honoured after the current step, not 50 steps later."""
    run = tmp_path / "run"
    args = SLOW_RUN + ["data.train_size=400", "trainer.epochs=1", "+task.delay=1.0", f"hydra.run.dir={run}"]
    proc = start_train(args, env=child_env(), start_new_session=True)
    try:
        wait_for_log(proc, run / "train.log", "data fake:", timeout=120)
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
    return run_train(
        list(args),
        script=("bash", "scripts/dist_train.sh", "2"),
        timeout=timeout,
        env={**child_env(), "PYTHON": sys.executable, "RUN_DIR": str(tmp_path / "run")},
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_ranks_agree_on_a_sigterm_at_the_same_step(tmp_path):
    """Only rank 0 gets the signal here; the vote stops both ranks at one step, and rank 0 saves it."""
    proc = _torchrun(tmp_path, *SLOW_RUN, "trainer.epochs=1", "+task.sigterm_step=3", "+task.delay=0.2")
    assert proc.returncode != 0
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and ckpt["step"] in (3, 4) and len(ckpt["rng"]) == 2
    assert f"stopped by SIGTERM at epoch 1 step {ckpt['step']}" in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_a_stalled_rank_stops_the_job_after_the_timeout_with_a_message(tmp_path):
    proc = _torchrun(
        tmp_path,
        *SLOW_RUN,
        "trainer.epochs=1",
        "trainer.dist_timeout=5",
        "+task.stall_rank=1",
        "+task.stall_step=2",
        "+task.stall_seconds=15",
    )
    assert proc.returncode != 0
    assert "another rank stalled or died" in proc.stderr and "trainer.dist_timeout=5 s" in proc.stderr
    assert "another rank stalled or died" in (tmp_path / "run" / "train.log").read_text()


# --- SIGTERM to the process group and Ctrl-C: save mid-epoch, exit 128 + signal -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_process_group_saves_mid_epoch(tmp_path, jpeg_cifar, sig, code):
    """What SLURM (SIGTERM) and a terminal's Ctrl-C (SIGINT) do: signal every process, DataLoader workers too."""
    run = tmp_path / "run"
    args = folder_run(jpeg_cifar, "data.batch_size=4", "trainer.epochs=2", "data.num_workers=2", f"hydra.run.dir={run}")
    proc = start_train(args, start_new_session=True)
    try:
        wait_for_log(proc, run / "train.log", "epoch 1/2 step 3/12")
        os.killpg(proc.pid, sig)
        assert proc.wait(timeout=120) == code
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read()
    assert "DataLoader worker" not in err and "Traceback" not in err, err[-3000:]
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 0 and ckpt["step"] >= 3
    assert f"stopped by {'SIGTERM' if code == 143 else 'SIGINT (Ctrl-C)'} at epoch 1 step" in err


def test_workers_ignore_stop_signals_and_keep_their_seeds(jpeg_cifar):
    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return torch.tensor(
                [
                    int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN),
                    int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN),
                    info.seed % 2**31,
                ]
            )

    cfg = compose(FAKE + ["data.num_workers=1", "data.batch_size=4"]).data
    loader = build_loader(cfg, "val", Probe(), seed=5)
    base = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item()
    [batch] = list(loader)
    assert batch[:, 0].tolist() == [1] * 4 and batch[:, 1].tolist() == [1] * 4
    assert batch[0, 2].item() == base % 2**31  # worker 0's seed: base seed + 0, as without the init fn


@pytest.mark.slow
def test_a_worker_iterator_alive_at_exit_does_not_hang_the_process():
    """An iterator that is never freed (a module global) keeps SIGTERM-ignoring workers to the end: the exit
    hook kills them, quietly, instead of multiprocessing waiting forever for them to take its SIGTERM."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "tests")!r})
        from helpers import FAKE, compose
        from addernet.data import build_loader
        batches = iter(build_loader(compose(FAKE + ["data.num_workers=1"]).data, "train"))
        next(batches)
        print("one batch")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "one batch", r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "killed by signal" not in r.stderr, r.stderr[-2000:]


def test_second_ctrl_c_stops_at_once():
    flag = StopFlag()
    flag(signal.SIGINT, None)
    assert flag.requested and flag.error.exit_code == 130 and flag.name == "SIGINT (Ctrl-C)"
    with pytest.raises(KeyboardInterrupt):
        flag(signal.SIGINT, None)
    term = StopFlag()
    term(signal.SIGTERM, None)
    term(signal.SIGTERM, None)  # a repeated SIGTERM still waits for the save
    assert term.error.exit_code == 143
