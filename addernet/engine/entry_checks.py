"""Checks of what a user passes to an entry point (train.py, test.py, the scripts), before Hydra or the run:
every key is applied or refused, a bad group choice or key is one line with the valid choices (exit 2),
and output paths never overwrite a run's own files.

``check_top_level(cfg, entry)``: the composed config's top-level keys are the ones configs/<entry>.yaml
(and the config it extends) defines (``+epochs=3`` is refused, not silently stored at the top of config.yaml).
``check_argv(argv, entry)``: the command line's group choices and keys, checked before Hydra composes
(Hydra would print a multi-line error and exit 1).
``check_option_keys(cfg, overrides)``: a ``group.key=`` override must be a key of the selected option
(``data.val_dir`` is not a key of data=fake, which would ignore it).
``check_output_path(path, key, inputs, overwrite)``: an output file never replaces an input or a file
of another kind.
"""

import difflib
import functools
import os

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from ..errors import ConfigError, reported
from .config import CONFIGS, HYDRA_KEYS, check_known_keys, entry_layout, group_keys


def _suggest(key, entry, configs=CONFIGS):
    groups, keys = entry_layout(entry, configs)
    candidates = sorted(keys | groups | {f"{g}.{k}" for g in groups for k in group_keys(g, configs)})
    close = difflib.get_close_matches(key, candidates, n=1) or [c for c in candidates if c.endswith("." + key)][:1]
    return f" (did you mean {close[0]}?)" if close else ""


def _valid(groups, keys):
    top = f"Valid top-level keys: {', '.join(sorted(keys))}; " if keys else ""
    return f"{top}groups (group.key=value): {', '.join(sorted(groups))}."


def check_top_level(cfg, entry, configs=CONFIGS):
    """ConfigError for a top-level key configs/<entry>.yaml does not define (e.g. ``+epochs=3``)."""
    groups, keys = entry_layout(entry, configs)
    unknown = sorted(set(cfg.keys()) - groups - keys)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]}{_suggest(unknown[0], entry, configs)}: {entry}.py has no such "
            f"setting, so it would be silently ignored. {_valid(groups, keys)}"
        )


def _options(group, configs=CONFIGS):
    """The options of configs/<group>/ (a file named ``_*.yaml`` is a block the options include, not an option)."""
    folder = os.path.join(configs, group)
    return (
        sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_"))
        if os.path.isdir(folder)
        else []
    )


# Hydra's own command-line flags that take a value (the value is no override), and those that print and exit
VALUE_FLAGS = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
    "--shell-completion",
    "-sc",
)
INFO_VALUES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
NO_RUN_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc", "--version")


def overrides_of(argv):
    """The overrides of a command line: Hydra's flags and their values removed (``--cfg job``, ``-i plugins``)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in VALUE_FLAGS or (a in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in INFO_VALUES)
        else:
            out.append(a)
    return out


def search_dirs(parsed):
    """The folders of a ``hydra.searchpath=[file://...]`` override: config groups kept outside configs/."""
    paths = [o.value() for o in parsed if o.key_or_group == "hydra.searchpath"]
    entries = paths[-1] if paths and isinstance(paths[-1], list) else []
    return [str(e)[len("file://") :] for e in entries if str(e).startswith("file://")]


def check_argv(argv, entry, configs=CONFIGS):
    """ConfigError for a command-line override Hydra would reject or that names nothing (checked before composing).

    A group choice must name a file of configs/<group>/ (or of <dir>/<group>/ for a hydra.searchpath dir);
    ``group.key=value`` without ``+`` must be a key of the group; a top-level ``key=value`` must be a key of the
    entry's config. Hydra's own keys pass.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides_of(argv))
    except HydraException as e:
        raise ConfigError(f"cannot parse the command line: {str(e).splitlines()[0]}") from None
    groups, keys = entry_layout(entry, configs)
    extra = search_dirs(parsed)
    chosen = {o.key_or_group: o.value() for o in parsed if "." not in o.key_or_group and not o.is_delete()}
    for o in parsed:
        name = o.key_or_group
        head, _, rest = name.partition(".")
        if head in HYDRA_KEYS or head.split("/")[0] in HYDRA_KEYS or o.is_delete():  # hydra/launcher=...
            continue
        if not rest and head in groups | {"experiment"}:
            value = o.value()
            choices = sorted({c for d in (configs, *extra) for c in _options(head, d)})
            if isinstance(value, str) and value not in ("null",) and value not in choices:
                raise ConfigError(
                    f"{head}={value} is not an option of {head}: choose one of {', '.join(choices)} (configs/{head}/)."
                )
            continue
        if rest and head in groups:
            if head == "task":
                continue  # a task class declares its own keys: checked once the config is composed
            check_known_keys(head, [rest.split(".")[0]], configs)
            option = chosen.get(head, None if "experiment" in chosen else default_choice(entry, head, configs))
            valid = option_keys(head, option, configs) if isinstance(option, str) else None
            if valid is not None and not (o.is_add() or o.is_force_add()) and rest.split(".")[0] not in valid:
                raise ConfigError(
                    f"{name} is not a setting of {head}={option}; its settings: "
                    f"{', '.join(sorted(valid))}. Choose the {head} it belongs to as well (e.g. "
                    f"data=cifar10_folder data.val_dir=...)."
                )
            continue
        if not rest and name in keys:
            continue
        raise ConfigError(
            f"unknown key {name}{_suggest(name, entry, configs)}: {entry}.py has no such setting. "
            f"{_valid(groups, keys)}"
        )


def groups_listing(entry, configs=CONFIGS):
    """The config groups of configs/<entry>.yaml and their options, one line each (for --help)."""
    groups, _ = entry_layout(entry, configs)
    return "\n".join(f"{g}: {', '.join(_options(g, configs))}" for g in sorted(groups) if _options(g, configs))


def check_run_dir(argv):
    """ConfigError when the run dir (hydra.run.dir=..., default outputs/) cannot be created (Hydra: exit 1)."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra.run.dir=")]
    target = given[-1] if given else "outputs"
    if "${" in target:
        return
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create the run dir {target} ({e.strerror or e}); choose a writable path with "
            f"hydra.run.dir=/path/to/run."
        ) from None


def precheck(argv, entry, run_dir=True):
    """check_argv (+ check_run_dir for training) on the command line; returns a one-line error or None."""
    try:
        check_argv(argv, entry)
        if run_dir and not any(a in ("-m", "--multirun") + NO_RUN_FLAGS for a in argv):
            check_run_dir(argv)
    except ConfigError as e:
        return str(e)
    return None


def exit_on_bad_command_line(argv, entry, prog, run_dir=True):
    """What every entry point runs before Hydra (whose own errors are multi-line, exit 1): precheck's error
    as ``<prog>: error: <message>`` on stderr and exit 2."""
    error = precheck(argv, entry, run_dir)
    if error:
        with reported(prog):
            raise ConfigError(error)


@functools.lru_cache(maxsize=None)
def default_choice(entry, group, configs=CONFIGS):
    """The option of ``group`` that configs/<entry>.yaml (or the config it extends) selects, or None."""
    node = OmegaConf.to_container(OmegaConf.load(os.path.join(configs, f"{entry}.yaml")))
    for item in node.get("defaults", []):
        if isinstance(item, dict) and group in item:
            return item[group]
        if isinstance(item, str) and item != "_self_" and os.path.isfile(os.path.join(configs, f"{item}.yaml")):
            found = default_choice(item, group, configs)
            if found is not None:
                return found
    return None


@functools.lru_cache(maxsize=None)
def option_keys(group, name, configs=CONFIGS):
    """The keys configs/<group>/<name>.yaml defines, with those of the options it extends (its defaults)."""
    path = os.path.join(configs, group, f"{name}.yaml")
    if not os.path.isfile(path):
        return None
    node = OmegaConf.to_container(OmegaConf.load(path))
    keys = {k for k in node if k != "defaults"}
    for item in node.get("defaults", []):
        if isinstance(item, str) and item != "_self_":
            keys |= option_keys(group, item, configs) or set()
    return frozenset(keys)


def check_option_keys(cfg, overrides, groups=("data", "model"), configs=CONFIGS):
    """ConfigError for an override ``group.key=`` whose key the selected option of ``group`` does not have."""
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        group, _, key = o.key_or_group.partition(".")
        if group not in groups or not key or o.is_delete():
            continue
        name = str(cfg[group].get("name"))
        valid = option_keys(group, name, configs)
        if valid is not None and key.split(".")[0] not in valid:
            raise ConfigError(
                f"{group}.{key} is not a setting of {group}={name} (the evaluated {group}), so it "
                f"would be ignored; its settings: {', '.join(sorted(valid))}. Choose the {group} it "
                f"belongs to as well (e.g. data=cifar10_folder data.val_dir=...)."
            )


def _looks_like_results(path):
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    lines = head.decode("utf-8", errors="replace").strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("{") and lines[0].endswith("}") and '"top1"' in lines[0]


def check_output_path(path, key, inputs=(), overwrite=False, results=False):
    """ConfigError when writing ``path`` (the ``key=`` setting) would replace an input file or a file of
    another kind. ``results``: it may replace an earlier one-line JSON results file; otherwise an existing
    file needs ``overwrite`` (and never one of ``inputs``)."""
    if not path:
        return
    target = os.path.realpath(str(path))
    for given in inputs:
        if given and os.path.exists(str(given)) and os.path.realpath(str(given)) == target:
            raise ConfigError(
                f"{key}={path} is the input checkpoint itself; writing it would destroy it. Give another path."
            )
    if not os.path.isfile(target) or os.path.getsize(target) == 0:
        return
    if results and _looks_like_results(target):
        return
    if results:
        raise ConfigError(
            f"{key}={path} exists and is not a results file (one JSON line); writing it would "
            f"replace it. Give another path, or delete the file first."
        )
    if not overwrite:
        raise ConfigError(
            f"{key}={path} exists; it is not replaced unless you pass overwrite=true (it may be a "
            f"training checkpoint). Give another path, or add overwrite=true."
        )
