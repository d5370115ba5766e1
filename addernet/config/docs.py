"""docs/configuration.md from the schema: ``python -m addernet.config.docs > docs/configuration.md``.

Every key of every group with its type, default and meaning (the field's trailing comment in schema.py),
so the reference cannot drift from what Hydra checks; tests/test_schema.py fails when the file is stale.
"""

import dataclasses
import re
from pathlib import Path

from omegaconf import MISSING

from . import schema

FIELD = re.compile(r"^    (\w+): .*?#\s*(.*)$")


def meanings():
    """{(class name, field name): the field's trailing comment}, read from schema.py."""
    out, owner = {}, None
    for line in Path(schema.__file__).read_text().splitlines():
        if line.startswith("class "):
            owner = line[6:].split("(")[0].split(":")[0]
        elif owner and (m := FIELD.match(line)):
            out[(owner, m.group(1))] = m.group(2)
    return out


def _type(f):
    return re.sub(r"typing\.|<class '(\w+)'>", lambda m: m.group(1) or "", str(f.type)).replace("NoneType", "None")


def _default(f):
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is MISSING:
        return "(set by the option)"
    return f"`{'null' if value is None else str(value).lower() if isinstance(value, bool) else value}`"


def _rows(node, notes, inherited=()):
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(node):
        if f.name in inherited:
            continue
        owner = next(c.__name__ for c in node.__mro__ if (c.__name__, f.name) in notes)
        meaning = notes[(owner, f.name)].replace("|", "\\|")  # a table cell
        lines.append(f"| `{f.name}` | {_type(f)} | {_default(f)} | {meaning} |")
    return lines


def render():
    notes = meanings()
    out = [
        "# Configuration reference",
        "",
        "Generated from addernet/config/schema.py by `python -m addernet.config.docs > docs/configuration.md`;",
        "do not edit by hand. Hydra refuses any other key and any value of another type (one line, exit 2).",
        "A YAML option (configs/<group>/<option>.yaml) names its schema first in its defaults list and sets",
        "its own values; a preset (configs/experiment/) changes values only. The rules between keys (ranges,",
        "trainer.accumulate against each process's share of data.batch_size, trainer.precise_bn against the",
        "model's BatchNorm layers, trainer.sync_bn on CPU, augmentation with data.on_device, ...) are checked",
        "once, before anything is built, by addernet.engine.config.check_config, which returns the typed",
        "Settings a training run reads.",
    ]
    registered = {node for _, _, node, _ in schema.SCHEMAS}
    for group, name, node, _ in schema.SCHEMAS:
        title = f"Entry point schema `{name[1:]}`" if group is None else f"`{group}`: schema `{name[1:]}`"
        base = node.__mro__[1] if node.__mro__[1] in registered else None  # listed above: only the new keys
        inherited = {f.name for f in dataclasses.fields(base)} if base else set()
        doc = (node.__doc__ or "").strip()
        out += ["", f"## {title}", ""]
        if doc and not doc.startswith(node.__name__ + "("):
            out += [doc, ""]
        if base:
            out += [f"Extends {base.__name__}; its own keys:", ""]
        out += _rows(node, notes, inherited)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
