"""What a train.py run dir recorded, read back: per-epoch metrics, overrides, facts, and failure.

Shared by the results tables (:mod:`addernet.analysis.summarize`) and the curves
(:mod:`addernet.analysis.curves`), so both read a run the same way and name the same bad line.
"""

import json
import re
from pathlib import Path

import yaml

# the per-epoch values the tables and the curves read: each is a number (or null) in a record train.py wrote
NUMBERS = (
    "train_loss",
    "train_top1",
    "val_loss",
    "val_top1",
    "val_top5",
    "images_per_s",
    "val_images_per_s",
    "epoch_seconds",
)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_metrics(run_dir):
    """Per-epoch records of ``run_dir``'s metrics.jsonl, by epoch; a resumed run's replayed epoch counts once
    (its last record). Lines without an ``epoch`` (events) are skipped. FileNotFoundError / ValueError name
    the file and, for a bad line (not JSON, an epoch that is not a whole number, a value that is not a number),
    its number."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a run directory written by train.py")
    by_epoch = {}
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON ({e})") from None
        if not (isinstance(rec, dict) and "epoch" in rec):
            continue
        bad = [k for k in NUMBERS if rec.get(k) is not None and not _is_number(rec[k])]
        if not (_is_number(rec["epoch"]) and float(rec["epoch"]).is_integer()) or bad:
            what = f'"epoch": {rec["epoch"]!r}' if not bad else f'"{bad[0]}": {rec[bad[0]]!r}'
            raise ValueError(
                f"{path}:{n} has {what}, not a number as train.py writes it: the file was edited or is not a "
                f"train.py metrics file; restore it or remove that line"
            )
        by_epoch[int(rec["epoch"])] = rec
    if not by_epoch:
        raise ValueError(f"{path} has no per-epoch records (the run did not finish an epoch; see its train.log)")
    return [by_epoch[e] for e in sorted(by_epoch)]


def _read(path, parse, kind):
    """``parse(text)`` of the file ``path``; ValueError naming the file when it cannot be read as ``kind``."""
    try:
        value = parse(path.read_text(errors="replace"))
    except (ValueError, yaml.YAMLError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path} cannot be read as {kind} ({first}); restore it or remove it") from None
    return value


def facts(run_dir):
    """run.json (device, image counts, data placement, compilation, as built), or {}; ValueError naming the file
    when it is damaged."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return {}
    value = _read(path, json.loads, "JSON")
    counts = ("train_images", "val_images")
    if not isinstance(value, dict) or any(value.get(k) is not None and not _is_number(value[k]) for k in counts):
        raise ValueError(f"{path} is not a run.json that train.py writes (an object with image counts); restore it")
    return value


def config(run_dir):
    """The run's resolved config.yaml as a dict, or {} when it wrote none (a job that failed at launch); ValueError
    naming the file when it is damaged."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    value = _read(path, yaml.safe_load, "YAML")
    if not isinstance(value, dict) or any(not isinstance(value.get(g, {}), dict) for g in ("model", "data", "trainer")):
        raise ValueError(f"{path} is not a config that train.py writes (model, data and trainer groups); restore it")
    return value


def overrides(run_dir):
    """The run's command-line overrides (Hydra's .hydra/overrides.yaml), without hydra.* keys; ValueError naming
    the file when it is damaged."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    value = _read(path, yaml.safe_load, "YAML")
    if not (isinstance(value, list) and all(isinstance(o, str) for o in value)):
        raise ValueError(f"{path} is not a list of overrides as Hydra writes it; restore it")
    return [o for o in value if not o.lstrip("+~").startswith("hydra.")]


def failure(run_dir):
    """(exit code, message) of a failed sweep job (its error.txt, written by addernet.engine.sweep), or None."""
    path = Path(run_dir) / "error.txt"
    if not path.is_file():
        return None
    text = path.read_text(errors="replace").strip()
    first, _, rest = text.partition("\n")
    code = re.fullmatch(r"exit code (\d+)", first.strip())
    return (int(code.group(1)), rest.strip()) if code else (1, text)


def find_runs(paths):
    """Run dirs (holding metrics.jsonl, or error.txt for a failed job) at or below each path, in order, each
    once; a path without any is kept as it is (reported as not measured)."""
    runs = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file() or (p / "error.txt").is_file():
            found = [p]
        else:
            found = sorted({m.parent for pattern in ("metrics.jsonl", "error.txt") for m in p.rglob(pattern)})
        runs += [r for r in (found or [p]) if r not in runs]
    return runs
