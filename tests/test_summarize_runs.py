"""addernet.analysis.summarize (scripts/summarize_runs.py): the results table (with mean ± std over seeds,
failed jobs as rows) and the throughput table with the projected time, from the files the runs recorded."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from addernet.analysis import summarize as mod


def _run(tmp_path, name, records, *, on_device=False, compile=False, layer="adder", **facts):
    d = Path(tmp_path) / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    OmegaConf.save(
        OmegaConf.create(
            {
                "model": {"name": "resnet20", "layer": layer},
                "data": {"on_device": on_device},
                "trainer": {"compile": compile, "seed": 0, "epochs": 400},
            }
        ),
        d / "config.yaml",
    )
    (d / "run.json").write_text(
        json.dumps(
            {
                "device": "cuda:0",
                "world_size": 1,
                "train_images": 50000,
                "val_images": 10000,
                "compiled": False,
                **facts,
            }
        )
    )
    return d


def _epoch(seconds, ips, vips, epoch=1, top1=50.0):
    return {
        "epoch": epoch,
        "epoch_seconds": seconds,
        "images_per_s": ips,
        "val_images_per_s": vips,
        "val_top1": top1,
        "val_top5": 90.0,
    }


def test_projection_is_the_last_epoch_at_the_runs_own_sizes(tmp_path):
    # last epoch: 50,000 / 10,000 img/s = 5 s train, 10,000 / 20,000 = 0.5 s val, 0.5 s overhead -> 6 s
    run = _run(
        tmp_path,
        "a",
        [_epoch(60.0, 1_000, 1_000), _epoch(6.0, 10_000, 20_000, epoch=2)],
        on_device=True,
        data_held_on="cuda:0",
    )
    row = mod.summarize(run)  # the run's own trainer.epochs (400) and image counts
    assert row["overhead_s"] == pytest.approx(0.5)
    assert row["projected_h"] == pytest.approx(400 * 6.0 / 3600)
    assert (row["data"], row["device"], row["epochs_run"], row["notes"]) == ("device", "cuda:0", 2, [])
    assert (
        "| a | resnet20 adder | device | off | cuda:0 | 10000 | 20000 | 6.00 | "
        "0.67 h (400 epochs x 50000+10000 images (its data)) |  |" in mod.table([row])
    )


def test_a_small_debug_run_is_projected_at_its_own_size_or_at_the_named_one(tmp_path):
    """64 FakeData images at 10 img/s: 6.4 s + 6.4 s per epoch plus 1.2 s overhead; never CIFAR-10's 50,000."""
    run = _run(tmp_path, "debug", [_epoch(14.0, 10, 10)], train_images=64, val_images=64)
    row = mod.summarize(run, epochs=2)
    assert row["projected_h"] == pytest.approx(2 * 14.0 / 3600)
    assert row["projection"] == "2 epochs x 64+64 images (its data)"
    cifar = mod.summarize(run, epochs=400, images=(50_000, 10_000))
    assert cifar["projected_h"] == pytest.approx(400 * (5_000 + 1_000 + 1.2) / 3600)
    assert cifar["projection"] == "400 epochs x 50000+10000 images (--images)"
    unknown = _run(tmp_path, "old", [_epoch(14.0, 10, 10)], train_images=None, val_images=None)
    assert mod.summarize(unknown)["projected_h"] is None
    assert "not projected" in mod.summarize(unknown)["notes"][-1]


def test_notes_say_what_did_not_take_effect(tmp_path):
    run = _run(tmp_path, "b", [_epoch(6.0, 10_000, 20_000)], on_device=True, compile=True, data_held_on="cpu")
    assert mod.summarize(run)["notes"] == [
        "one epoch only: includes warm-up",
        "data held on cpu, not cuda:0 (build_loader got no device)",
        "not compiled (the model was not compiled)",
    ]


def test_a_run_without_metrics_is_reported_not_measured(tmp_path, capsys):
    good = _run(tmp_path, "c", [_epoch(6.0, 10_000, 20_000)])
    (tmp_path / "d").mkdir()
    assert mod.main([str(good), str(tmp_path / "d"), "--json", str(tmp_path / "rows.json")]) == 1
    out = capsys.readouterr().out
    assert "| c | resnet20 adder | DataLoader |" in out and f"not measured: {tmp_path / 'd'}" in out
    assert [r["run"] for r in json.loads((tmp_path / "rows.json").read_text())] == ["c"]


def test_results_table_of_a_sweep_dir_with_a_seed_only_group(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for i, (seed, finals) in enumerate([(0, (40.0, 60.0)), (1, (50.0, 70.0)), (2, (45.0, 80.0))]):
        run = _run(
            sweep,
            f"{i}_trainer.seed={seed}",
            [_epoch(10.0, 100, 200, 1, finals[0]), _epoch(8.0, 300, 200, 2, finals[1])],
        )
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(
            f"- model.layer=adder\n- trainer.seed={seed}\n- hydra.job.num={i}\n"
        )
        OmegaConf.save(
            OmegaConf.merge(OmegaConf.load(run / "config.yaml"), {"trainer": {"seed": seed}}), run / "config.yaml"
        )
    assert mod.main([str(sweep), "--csv", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out
    row = (
        "| 1_trainer.seed=1 | ok | model.layer=adder trainer.seed=1 | 1 | 2 | 70.00 | 90.00 | 70.00 (2) | 90.00 | 300 |"
    )
    assert row + " 18.0 |" in out
    # final top-1 60, 70, 80: mean 70, sample std 10; best = final here
    assert (
        "| mean ± std (3 of 3 seeds) | ok | model.layer=adder | 0,1,2 | 2 | 70.00 ± 10.00 | 90.00 ± 0.00 | "
        "70.00 ± 10.00 |" in out
    )
    import csv

    rows = list(csv.DictReader((tmp_path / "r.csv").read_text().splitlines()))
    assert len(rows) == 4 and rows[0]["final_top1"] == "60.0" and rows[0]["final_top1_std"] == ""
    assert (rows[-1]["seed"], rows[-1]["final_top1"], rows[-1]["final_top1_std"]) == ("0,1,2", "70.0", "10.0")


def test_a_failed_job_is_a_failed_row_and_the_seeds_are_counted_honestly(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for i, seed in enumerate((0, 1)):
        run = _run(sweep, f"{i}_trainer.seed={seed}", [_epoch(8.0, 300, 200, 1, 60.0 + 10 * i)])
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(f"- trainer.seed={seed}\n")
        OmegaConf.save(
            OmegaConf.merge(OmegaConf.load(run / "config.yaml"), {"trainer": {"seed": seed}}), run / "config.yaml"
        )
    failed = sweep / "2_trainer.seed=-1"  # failed at launch: no metrics, no config.yaml
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- trainer.seed=-1\n")
    (failed / "error.txt").write_text("exit code 2\ntrain.py: error: trainer.seed=-1 must be >= 0\n")
    assert mod.main([str(sweep)]) == 1
    out = capsys.readouterr().out
    assert "| 2_trainer.seed=-1 | failed (exit 2) | trainer.seed=-1 |  | 0 |" in out
    assert "| mean ± std (2 of 3 seeds) | 1 failed | (none) | 0,1 | 1 | 65.00 ± 7.07 |" in out
    assert "failed: 2_trainer.seed=-1: train.py: error: trainer.seed=-1 must be >= 0" in out


def test_a_null_top1_gives_a_row_and_a_bad_line_is_named(tmp_path, capsys):
    records = [_epoch(8.0, 300, 200, 1, 50.0), {**_epoch(8.0, 300, 200, 2), "val_top1": None, "val_top5": None}]
    run = _run(tmp_path, "nulls", records)
    row = mod.result_row(run)
    assert (row["final_top1"], row["best_top1"], row["best_epoch"], row["best_top5"]) == (None, 50.0, 1, 90.0)
    assert mod.main([str(run)]) == 0
    assert "| nulls | ok | (none) | 0 | 2 |  |  | 50.00 (1) | 90.00 |" in capsys.readouterr().out
    (run / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n\n{broken\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:3 is not valid JSON"):
        mod.result_row(run)


def test_csv_and_json_never_replace_a_file_this_command_did_not_write(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    run = _run(tmp_path / "runs", "o1", [_epoch(6.0, 10, 20)])
    jsonl = (run / "metrics.jsonl").read_text()
    for option, target in (("--csv", run / "metrics.jsonl"), ("--json", run / "config.yaml")):
        before = target.read_bytes()
        with pytest.raises(SystemExit) as e:
            mod.main([str(tmp_path / "runs"), option, str(target)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert f"{option} {target}: that file exists and was not written by this command" in err
        assert "--overwrite" in err and target.read_bytes() == before
    # its own outputs are replaced by the next run; another file only with --overwrite
    out = ["--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "rows.json")]
    assert mod.main([str(tmp_path / "runs"), *out]) == 0
    assert mod.main([str(tmp_path / "runs"), *out]) == 0
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith("run,status,")
    (tmp_path / "mine.csv").write_text("a user's table\n")
    assert mod.main([str(tmp_path / "runs"), "--csv", str(tmp_path / "mine.csv"), "--overwrite"]) == 0
    assert (tmp_path / "mine.csv").read_text() == (tmp_path / "r.csv").read_text()
    assert (run / "metrics.jsonl").read_text() == jsonl


@pytest.mark.parametrize(
    "file, text",
    [
        ("metrics.jsonl", json.dumps({**_epoch(6.0, 10, 20), "epoch": "1"}) + "\n"),
        ("metrics.jsonl", json.dumps({**_epoch(6.0, 10, 20), "val_top1": "50"}) + "\n"),
        ("metrics.jsonl", json.dumps({**_epoch(6.0, 10, 20), "epoch": float("inf")}) + "\n"),
        ("config.yaml", "model: [resnet20\n"),
        ("config.yaml", "- a list\n"),
        ("config.yaml", "trainer: 5\n"),
        ("run.json", "{not json"),
        ("run.json", '{"train_images": "all"}'),
        (".hydra/overrides.yaml", "- [\n"),
    ],
    ids=["epoch-text", "top1-text", "epoch-inf", "yaml", "list", "group", "run-json", "counts", "overrides"],
)
def test_a_damaged_file_is_one_line_naming_it_and_the_other_runs_are_summarised(tmp_path, capsys, file, text):
    good = _run(tmp_path, "good", [_epoch(6.0, 10_000, 20_000)])
    bad = _run(tmp_path, "bad", [_epoch(6.0, 10_000, 20_000)])
    (bad / file).parent.mkdir(exist_ok=True)
    (bad / file).write_text(text)
    code = mod.main([str(good), str(bad)])
    out = capsys.readouterr().out
    assert "| good | ok |" in out and "| good | resnet20 adder |" in out
    [line] = [x for x in out.splitlines() if x.startswith("not measured:")]
    assert code == 1 and line.startswith(f"not measured: {bad}: {bad / file}"), line
    assert "| bad | resnet20 adder |" not in out  # no throughput row; run.json is not read for the results row
    assert ("| bad | ok |" in out) == (file == "run.json")


@pytest.mark.parametrize("option", [["--epochs", "-3"], ["--epochs", "0"], ["--images", "50000", "-1"]])
def test_a_projection_of_no_epochs_or_images_is_refused(tmp_path, capsys, option):
    run = _run(tmp_path, "a", [_epoch(6.0, 10_000, 20_000)])
    with pytest.raises(SystemExit) as e:
        mod.main([str(run), *option])
    assert e.value.code == 2 and f"'{option[-1]}' is not a whole number >= 1" in capsys.readouterr().err
