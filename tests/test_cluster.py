"""Cluster launch: SLURM's task variables become torchrun's, and Hydra's submitit_local launcher runs a 2-job
sweep end to end (summarized by scripts/summarize_runs.py), then resumes it; a sweep with a failed job exits
non-zero whatever the launcher."""

import json
import os
import sys
from types import SimpleNamespace

import pytest

from addernet.analysis.summarize import main as summarize_runs
from addernet.distributed import adopt_slurm_environment, first_host

from helpers import REPO, TINY_RUN, run_main, run_train

# one job of a sweep: a LeNet-5-BN on 32 FakeData images, the debug preset's short run
SWEEP_JOB = ["experiment=debug", *TINY_RUN, "data.train_size=32", "data.val_size=16", "trainer.device=cpu"]


@pytest.mark.parametrize(
    "nodelist, host",
    [("node7", "node7"), ("gpu[07-09,12]", "gpu07"), ("gpu[3,5],cpu1", "gpu3"), ("a-b[001-004]", "a-b001")],
)
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_slurm_tasks_become_torchrun_ranks_and_torchrun_wins():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[10-11]",
        "SLURM_JOB_ID": "123456",
    }
    assert adopt_slurm_environment(env)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "5",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu10",
        "MASTER_PORT": "23456",
    }
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert not adopt_slurm_environment(torchrun) and torchrun["RANK"] == "0"
    single = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert not adopt_slurm_environment(single) and "RANK" not in single


@pytest.mark.integration
@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep_then_resumes_it(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher")
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "hydra/launcher=submitit_local",
        *SWEEP_JOB,
        "trainer.seed=0,1",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = run_train(args, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").is_file())
    assert [p.name.split("_")[0] for p in jobs] == ["0", "1"] and all(
        p.name.endswith(f"trainer.seed={i}") for i, p in enumerate(jobs)
    )
    table = run_main(lambda: sys.exit(summarize_runs()), "summarize_runs.py", [sweep])  # in this process
    assert table.returncode == 0, table.stdout + table.stderr
    assert "| mean ± std (2 of 2 seeds) |" in table.stdout and table.stdout.count("| 1 | ") >= 2

    resumed = run_train(args + ["trainer.epochs=2"], env=env, timeout=600)  # the same job dirs, one more epoch
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in jobs:
        assert "resumed from" in (job / "train.log").read_text()
        assert [json.loads(line)["epoch"] for line in (job / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.integration
@pytest.mark.slow
def test_optuna_search_runs_two_trials_and_reports_the_best(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install hydra-optuna-sweeper")
    from omegaconf import OmegaConf

    sweep = tmp_path / "search"
    args = [
        "-m",
        "hparams_search=lr_eta",
        "hydra.sweeper.n_trials=2",
        *SWEEP_JOB,
        f"hydra.sweep.dir={sweep}",
    ]
    done = run_train(args, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").is_file())
    assert len(trials) == 2
    best = [json.loads((t / "metrics.jsonl").read_text().splitlines()[-1])["val_top1"] for t in trials]
    result = OmegaConf.load(sweep / "optimization_results.yaml")
    assert result.best_value == max(best) and set(result.best_params) == {"optim.lr", "adaptive_lr.eta"}


def test_a_job_that_raises_is_recorded_and_the_launching_process_counts_it(tmp_path, monkeypatch):
    """SweepOutcome in the job's process writes error.txt and a failures.log line for any exception; in the
    launching process (which ran no job itself, as with submitit) it reads the new failures.log lines."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from addernet.engine import sweep

    (tmp_path / "failures.log").write_text("job 9 (old sweep): exit code 7: earlier\n")  # not this sweep's
    job = SimpleNamespace(
        mode=RunMode.MULTIRUN,
        job=SimpleNamespace(num=1),
        overrides=SimpleNamespace(task=["trainer.seed=1"]),
        runtime=SimpleNamespace(output_dir=str(tmp_path / "1_trainer.seed=1")),
        sweep=SimpleNamespace(dir=str(tmp_path)),
    )
    monkeypatch.setattr(sweep, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: job))
    monkeypatch.setattr(sweep, "FAILED", [])
    launcher = sweep.SweepOutcome()
    launcher.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    crashed = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("CUDA error: device-side assert"))
    sweep.SweepOutcome().on_job_end(None, crashed)  # in the job's process
    assert (tmp_path / "1_trainer.seed=1" / "error.txt").read_text() == (
        "exit code 1\nRuntimeError: CUDA error: device-side assert\n"
    )
    monkeypatch.setattr(sweep, "FAILED", [])  # the launching process ran no job
    assert sweep.sweep_exit_code() == 0
    launcher.on_multirun_end(None)
    assert sweep.sweep_exit_code() == 1 and sweep.FAILED == [1]


@pytest.mark.integration
@pytest.mark.slow
def test_a_submitit_sweep_with_a_failed_job_exits_non_zero_and_summarizes_it(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher")
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=submitit_local", *SWEEP_JOB, "trainer.seed=0,-1", f"hydra.sweep.dir={sweep}"]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = run_train(args, env=env, timeout=600)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    [failure] = (sweep / "failures.log").read_text().splitlines()
    assert failure.startswith("job 1 (") and "exit code 2" in failure
    table = run_main(lambda: sys.exit(summarize_runs()), "summarize_runs.py", [sweep])  # in this process
    assert table.returncode == 1, table.stdout + table.stderr
    assert "| failed (exit 2) | experiment=debug" in table.stdout
    assert "| mean ± std (1 of 2 seeds) | 1 failed |" in table.stdout
