"""What a train.py run dir recorded, read back: per-epoch metrics, overrides, facts, and failure.

Shared by the results tables (:mod:`addernet.analysis.summarize`) and the curves
(:mod:`addernet.analysis.curves`), so both read a run the same way and name the same bad line.
"""

import json
import re
from pathlib import Path

from omegaconf import OmegaConf


def load_metrics(run_dir):
    """Per-epoch records of ``run_dir``'s metrics.jsonl, by epoch; a resumed run's replayed epoch counts once
    (its last record). Lines without an ``epoch`` (events) are skipped. FileNotFoundError / ValueError name
    the file and, for a bad line, its number."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a run directory written by train.py")
    by_epoch = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON ({e})") from None
        if isinstance(rec, dict) and "epoch" in rec:
            by_epoch[rec["epoch"]] = rec
    if not by_epoch:
        raise ValueError(f"{path} has no per-epoch records (the run did not finish an epoch; see its train.log)")
    return [by_epoch[e] for e in sorted(by_epoch)]


def facts(run_dir):
    """run.json (device, image counts, data placement, compilation, as built), or {}."""
    path = Path(run_dir) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def config(run_dir):
    """The run's resolved config.yaml as a dict, or {} when it wrote none (a job that failed at launch)."""
    path = Path(run_dir) / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}


def overrides(run_dir):
    """The run's command-line overrides (Hydra's .hydra/overrides.yaml), without hydra.* keys."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [o for o in OmegaConf.to_container(OmegaConf.load(path)) if not o.lstrip("+~").startswith("hydra.")]


def failure(run_dir):
    """(exit code, message) of a failed sweep job (its error.txt, written by addernet.engine.sweep), or None."""
    path = Path(run_dir) / "error.txt"
    if not path.is_file():
        return None
    text = path.read_text().strip()
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
