"""What is wrong with a command line or a composed config, in one line with the closest valid key.

Hydra refuses unknown keys and wrong types through the schema; ``+group.key=`` adds a key even to a
structured config, so :func:`check_schema` refuses keys the schema does not declare after composing.
:func:`as_schema` turns a composed node into its schema's dataclasses, which checks every value's own rule.
:func:`one_line` turns Hydra's and OmegaConf's multi-line errors into ``<what> (did you mean <key>?)``.
"""

import dataclasses
import difflib
import re

from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from ..errors import ConfigError
from .schema import SCHEMAS

ENTRIES = {node: name[1:] for group, name, node, _ in SCHEMAS if group is None}  # TrainConfig: "train"


def _hint(key, valid):
    close = difflib.get_close_matches(str(key), sorted(valid), n=1, cutoff=0.5)
    close = close or [v for v in sorted(valid) if v.endswith(f".{key}") or key.startswith(f"{v}.")][:1]
    return f" (did you mean {close[0]}?)" if close else ""


def _declared(node):
    """The keys the schema declares for ``node``, or None for a node without a schema (a plain dict)."""
    kind = OmegaConf.get_type(node)
    return {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None


def unknown_key(full_key, valid, owner, nested=()):
    """The one-line error of a key ``owner`` does not have; ``nested``: further candidates (``trainer.epochs``)."""
    prefix = full_key.rpartition(".")[0]
    candidates = [f"{prefix}.{k}" if prefix else k for k in sorted(valid)] + list(nested)
    return (
        f"unknown key {full_key}{_hint(full_key, candidates)}: {owner} has no such setting; "
        f"its settings: {', '.join(sorted(valid))}."
    )


def _owner(node, path):
    name = node.get("name") if "name" in _declared(node) else None
    if not path:
        return ENTRIES.get(OmegaConf.get_type(node), "the config")  # the entry point: train, test ...
    return f"{path}={name}" if isinstance(name, str) else path


def check_schema(cfg, extra=None, path=""):
    """ConfigError for a key of a structured node that its schema does not declare (e.g. ``+trainer.epoch=1``).

    ``extra``: {group: further keys it may hold}, e.g. the ``config_keys`` of a task class kept outside the package.
    """
    declared = _declared(cfg)
    if declared is not None and extra and path in extra:
        declared |= set(extra[path])
    for key in cfg.keys():
        full = f"{path}.{key}" if path else str(key)
        if declared is not None and key not in declared:
            groups = [g for g in cfg.keys() if isinstance(cfg._get_node(g), DictConfig)] if not path else []
            nested = [f"{g}.{k}" for g in groups for k in cfg[g] or ()]  # +epochs=3: trainer.epochs
            raise ConfigError(unknown_key(full, declared, _owner(cfg, path), nested))
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            check_schema(child, extra, full)


def as_schema(node, schema, path):
    """``node`` as its schema's dataclasses (``OmegaConf.to_object``), which runs every value's own rule (the classes'
    ``__post_init__``). A node composed without a schema (a checkpoint's stored group) is read as ``schema``, the
    keys it does not declare left out. A value missing or of the wrong type: ConfigError in one line."""
    try:
        if schema is None or dataclasses.is_dataclass(OmegaConf.get_type(node)):
            return OmegaConf.to_object(node)
        names = {f.name for f in dataclasses.fields(schema)}
        values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k in names}
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as e:
        message = one_line(e)
        raise ConfigError(message if not path or message.startswith(path) else f"{path}.{message}") from None


TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _type_name(node):
    kind = node._metadata.ref_type
    return TYPE_NAMES.get(kind) or str(kind).replace("typing.", "")


def one_line(e):
    """One line for a composition error of Hydra or OmegaConf, naming the key and the closest valid one."""
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, value = e.missing_cfg_file.rpartition("/")
        options = [o for o in (e.options or []) if not o.startswith("_")]
        hint = _hint(value, options)
        return f"{group}={value} is not an option of {group}{hint}; choose one of {', '.join(options)}."
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        key, parent = str(cause.full_key), cause.parent_node
        if isinstance(cause, ValidationError):
            node = parent._get_node(cause.key) if isinstance(parent, DictConfig) and cause.key in parent else None
            expected = f" (takes {_type_name(node)})" if node is not None else ""
            return f"{key}{expected}: {cause.msg.splitlines()[0]}."
        if isinstance(parent, DictConfig) and cause.key is not None and cause.key not in parent:
            valid = _declared(parent) or set(parent.keys())
            return unknown_key(key, valid, _owner(parent, key.rpartition(".")[0]))
        return f"{key}: {cause.msg.splitlines()[0]}"
    if "must be a string or a list" in str(e):  # logger=null: a group the config needs
        return "a config group set to null (e.g. logger=null) needs one of its options instead; --help lists them"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = re.sub(r"^In '[^']*': ", "", lines[0] if lines else type(e).__name__)
    return f"{text} (--help lists the groups and their options)"
