"""addernet.analysis.curves (scripts/plot_curves.py): reads metrics.jsonl run directories and draws curves."""

import json
import sys

import pytest

from addernet.analysis import curves
from addernet.analysis.runs import load_metrics
from addernet.errors import ConfigError

from helpers import run_script


def _run_dir(tmp_path, name, records):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def _records(offset):
    return [
        {
            "epoch": e,
            "lr": 0.1,
            "train_loss": 2.0 - e / 10 + offset,
            "train_top1": 10.0 * e + offset,
            "val_loss": 2.1 - e / 10 + offset,
            "val_top1": 9.0 * e + offset,
            "val_top5": 50.0 + e,
        }
        for e in (1, 2, 3)
    ]


def test_load_metrics_keeps_last_record_per_epoch_and_skips_non_epoch_lines(tmp_path):
    recs = _records(0)
    resumed = dict(recs[2], val_top1=99.0)  # a resumed run re-logs epoch 3
    d = _run_dir(tmp_path, "run", recs + [{"event": "resume"}, resumed])
    got = load_metrics(d)
    assert [r["epoch"] for r in got] == [1, 2, 3]
    assert got[2]["val_top1"] == 99.0


def test_load_metrics_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        load_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not valid JSON"):
        load_metrics(tmp_path)


def test_plot_overlays_runs_with_their_values(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    runs = [("adder", _records(0)), ("cnn", _records(5))]
    fig = curves.plot(runs, tmp_path / "c.png")
    top1_ax, loss_ax = fig.axes
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in top1_ax.get_lines()}
    assert lines["adder val"] == ([1, 2, 3], [9.0, 18.0, 27.0])
    assert lines["cnn train"] == ([1, 2, 3], [15.0, 25.0, 35.0])
    loss = {ln.get_label(): list(ln.get_ydata()) for ln in loss_ax.get_lines()}
    assert loss["cnn val"] == pytest.approx([7.0, 6.9, 6.8])
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cli(*args):
    """``python scripts/plot_curves.py args...``, in this process."""
    return run_script("scripts/plot_curves.py", args)


def test_cli_writes_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    a, b = _run_dir(tmp_path, "adder", _records(0)), _run_dir(tmp_path, "cnn", _records(1))
    out = tmp_path / "curves.png"
    r = _cli(a, b, "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    a = _run_dir(tmp_path, "adder", _records(0))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails, as where it is not installed
    r = _cli(a)
    assert r.returncode == 2  # a user error: one line, exit 2, as train.py
    assert "pip install matplotlib" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_missing_run_dir_is_a_clear_error(tmp_path):
    r = _cli(tmp_path / "nope")
    assert r.returncode == 2
    assert "metrics.jsonl not found" in r.stderr and "Traceback" not in r.stderr


def test_one_epoch_run_shows_a_point_on_integer_epoch_ticks(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    fig = curves.plot([("one", _records(0)[:1]), ("three", _records(1))], tmp_path / "c.png")
    fig.canvas.draw()
    for ax in fig.axes:
        assert all(ln.get_marker() not in (None, "", "None") for ln in ax.get_lines())
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    single = curves.plot([("one", _records(0)[:1])], tmp_path / "d.png")
    single.canvas.draw()
    ticks = [
        t for t in single.axes[0].get_xticks() if single.axes[0].get_xlim()[0] <= t <= single.axes[0].get_xlim()[1]
    ]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_log_scale_keeps_an_early_loss_spike_readable_and_the_title_names_the_runs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    spike = [dict(r, val_loss=89.0 if r["epoch"] == 1 else r["val_loss"]) for r in _records(0)]
    fig = curves.plot([("adder-r20", _records(1)), ("cnn-r20", spike)], tmp_path / "c.png", log=True)
    top1_ax, loss_ax = fig.axes
    assert (top1_ax.get_yscale(), loss_ax.get_yscale()) == ("linear", "log")
    assert fig._suptitle.get_text() == "adder-r20 vs cnn-r20"
    assert curves.plot([("a", _records(0))], tmp_path / "d.png").axes[1].get_yscale() == "linear"


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg", "eps", "ps"])
def test_out_replaces_only_a_figure_it_made_and_says_which_file_it_wrote(tmp_path, capsys, fmt):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    run = _run_dir(tmp_path, "adder", _records(0))
    out = tmp_path / "figs" / f"curves.{fmt}"  # a folder that does not exist yet
    curves.main([str(run), "--out", str(out)])
    curves.main([str(run), "--out", str(out), "--log"])  # its own figure: replaced
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out} (1 run(s))"
    user = tmp_path / f"photo.{fmt}"
    user.write_bytes(b"a user's own picture " * 100)
    with pytest.raises(ConfigError, match=f"--out {user}: that file exists and was not written by this command"):
        curves.main([str(run), "--out", str(user)])
    assert user.read_bytes() == b"a user's own picture " * 100
    curves.main([str(run), "--out", str(user), "--overwrite"])
    assert curves._ours(user)


def test_out_without_an_extension_is_a_png_named_as_written(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    run = _run_dir(tmp_path, "adder", _records(0))
    curves.main([str(run), "--out", str(tmp_path / "curvesnoext")])
    png = tmp_path / "curvesnoext.png"
    assert capsys.readouterr().out.strip() == f"wrote {png} (1 run(s))"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curvesnoext").exists()


def test_cli_out_in_a_format_it_does_not_write_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    run = _run_dir(tmp_path, "adder", _records(0))
    monkeypatch.chdir(tmp_path)
    r = _cli(run, "--out", "x.txt")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("plot_curves.py: error: --out x.txt: .txt is not a format plot_curves.py writes; use ")
    assert [p.name for p in tmp_path.iterdir()] == ["adder"]


def test_out_below_a_file_names_the_folder_it_cannot_create(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra of plot_curves.py")
    run = _run_dir(tmp_path, "adder", _records(0))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=f"cannot create its folder {tmp_path / 'file' / 'sub'} \\(Not a directory"):
        curves.main([str(run), "--out", str(tmp_path / "file" / "sub" / "c.png")])
