"""Each setting is declared once: its default lives in the schema (addernet/config/schema.py), and a YAML file
(a group's option, an entry point's config, a preset) states only the values in which it differs.

A line restates a default when deleting it changes nothing Hydra composes: every value line of every config file is
deleted in turn from a copy of configs/, and the composition of the choices that read the file is compared with
the original's (values as written, interpolations unresolved).
"""

import re
import shutil

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import REPO

CONFIGS = REPO / "configs"
ENTRIES = {"train": [], "test": [], "quantize": [], "export_onnx": []}  # entry point -> overrides it composes with
LINE = re.compile(r"^(\s*)([\w.]+):\s*(.*?)\s*(#.*)?$")


def _choices(path):
    """(config name, overrides) of the compositions that read ``path`` (a file under configs/)."""
    rel = path.relative_to(CONFIGS)
    if len(rel.parts) == 1:
        return [(rel.stem, ENTRIES[rel.stem])]
    group, option = rel.parts[0], rel.stem
    if group == "experiment":
        return [("train", [f"experiment={option}"])]
    return [("test" if group == "quant" else "train", [f"{group}={option}"])]


def _files():
    """Every config file that sets values: entry points, group options, presets (not Hydra's own groups, not the
    blocks presets include: those are read through the presets)."""
    files = [CONFIGS / f"{name}.yaml" for name in ENTRIES]
    for path in sorted(CONFIGS.glob("*/*.yaml")):
        if path.parent.name not in ("hydra", "hparams_search"):
            files.append(path)
    return files


def _value_lines(lines):
    """Indexes of the lines that set a value (not the defaults list, not the hydra node, not a block header)."""
    out, skip = [], None
    for i, line in enumerate(lines):
        m = LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        if skip is not None and indent > skip:
            continue
        skip = None
        if indent == 0 and m.group(2) in ("defaults", "hydra"):
            skip = 0
            continue
        if m.group(3):  # key: value (a header "key:" opens a block)
            out.append(i)
    return out


def _without(lines, i):
    """``lines`` without line i, and without its block header when that leaves the block empty."""
    kept = lines[:i] + lines[i + 1 :]
    indent = len(LINE.match(lines[i]).group(1))
    if indent:
        header = max(j for j in range(i) if LINE.match(lines[j]) and len(LINE.match(lines[j]).group(1)) < indent)
        rest = [x for x in kept[header + 1 :] if x.strip() and not x.lstrip().startswith("#")]
        if not rest or len(rest[0]) - len(rest[0].lstrip()) <= len(LINE.match(lines[header]).group(1)):
            return _without(kept, header) if LINE.match(lines[header]).group(3) else kept[:header] + kept[header + 1 :]
    return kept


def _composed(choices):
    return [OmegaConf.to_container(compose(name, overrides)) for name, overrides in choices]


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_no_config_file_restates_a_default(path, tmp_path):
    copy = tmp_path / "configs"
    shutil.copytree(CONFIGS, copy)
    target = copy / path.relative_to(CONFIGS)
    text = path.read_text()
    lines = text.splitlines()
    choices, restated = _choices(path), []
    with initialize_config_dir(config_dir=str(copy), version_base="1.3"):  # each compose reads the files again
        before = _composed(choices)
        for i in _value_lines(lines):
            target.write_text("\n".join(_without(lines, i)) + "\n")
            if _composed(choices) == before:
                restated.append(lines[i].strip())
    assert not restated, (
        f"{path.relative_to(REPO)} restates what the schema (addernet/config/schema.py) or the file it extends "
        f"already gives; delete these lines: {restated}"
    )
