"""One handler for every entry point: compose with Hydra, run, and report a bad command line in one line.

Hydra's own errors (an unknown key, a wrong type, a missing option) are multi-line and exit 1; here they
are one line with the closest valid key, exit 2, like every other error of a user's input.
"""

import os
import re
import shlex
import sys

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Quote, QuotedString
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import AdderNetError
from . import config_dir
from .validate import one_line

COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException, AdderNetError, ValueError, OSError)


def run_entry(prog, config_name, task):
    """Compose configs/<config_name>.yaml from sys.argv and call ``task(cfg)``; returns what it returns.

    An error before ``task`` starts (composition, the run dir) prints ``<prog>: error: <one line>`` and exits 2;
    errors of the run itself are the task's to report.
    """
    started = []
    OmegaConf.register_new_resolver("entry_groups", groups_listing, replace=True)  # --help: the entry's groups

    @hydra.main(version_base="1.3", config_path=config_dir(), config_name=config_name)
    def main(cfg):
        started.append(True)
        return task(cfg)

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a trace: reported below
    try:
        return main()
    except COMPOSITION_ERRORS as e:
        if started:
            raise
        if isinstance(e, OSError) and not isinstance(e, HydraException):  # the run dir cannot be created
            message = f"cannot create {e.filename} ({e.strerror or e}); choose a writable path with hydra.run.dir=..."
        else:
            message = unreadable_value(e) or preset_key(e, sys.argv[1:]) or one_line(e)
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))


def hydra_value(value):
    """``value`` (None, bool, number, string, list or dict) in Hydra's override grammar; strings quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return QuotedString(text=value, quote=Quote.single).with_quotes()
    if isinstance(value, (list, tuple)):
        return f"[{','.join(map(hydra_value, value))}]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no override form for a {type(value).__name__}")


def shell_override(key, text):
    """``key=text`` for a shell command line: as it is where Hydra reads it back as ``text``, else with ``text`` in
    Hydra's quotes (a path with = , ~ or a non-ASCII letter); quoted for the shell where needed."""
    plain = f"{key}={text}"
    try:
        same = OverridesParser.create().parse_override(plain).value() == text
    except HydraException:
        same = False
    return shlex.quote(plain if same else f"{key}={QuotedString(text=text, quote=Quote.double).with_quotes()}")


def unreadable_value(e):
    """The one line for a value Hydra's override grammar cannot read (a path with = , ~ ( ) or a non-ASCII letter),
    with the quoted form that it reads; None for other errors."""
    item = e.override if isinstance(e, OverrideParseException) else None
    ambiguous = re.match(r"Ambiguous value for argument '(.*)'$", str(e).splitlines()[0]) if str(e) else None
    item = ambiguous.group(1) if ambiguous else item
    if not item or "=" not in item:
        return None
    key, value = item.split("=", 1)
    quoted = shell_override(key, value)
    why = (
        "a comma makes it a list of values (for a list write key=[a,b]; to sweep them add -m)"
        if ambiguous
        else "Hydra's override grammar reads characters such as = , ~ ( ) [ ] { } ' and non-ASCII letters "
        "outside quotes as syntax, or not at all"
    )
    home = (
        " (quoted, a leading ~ is a folder named ~, not your home: write $HOME/... instead)" if value[:1] == "~" else ""
    )
    return f"cannot read the value of {item}: {why}; quote the value: {quoted}{home}."


def preset_key(e, argv):
    """The one line for a preset (experiment=...) setting a key that the group option the command line chose does
    not have, e.g. experiment=mnist_lenet5_bn_adder model=resnet20; None for other errors."""
    found = re.search(
        r"In '(experiment/[^']+)': ConfigKeyError raised while composing config:\s*Key '[^']+' not in "
        r"'[^']+'\s*full_key: (\S+)",
        str(e),
    )
    if not found:
        return None
    preset, key = found.group(1).replace("/", "="), found.group(2)
    group = key.split(".")[0]
    chosen = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == group and "=" in a]
    option = f"{group}={chosen[-1]}" if chosen else f"the {group} option chosen"
    return (
        f"{preset} sets {key}, which {option} does not have: the preset is made for its own {group} option. "
        f"Drop {option} to train the preset as it is, or use a preset made for {option} (configs/experiment/)."
    )


def entry_groups(entry):
    """The config groups the defaults list of configs/<entry>.yaml chooses (and of the entry config it extends)."""
    root, groups = config_dir(), set()
    for item in OmegaConf.load(os.path.join(root, f"{entry}.yaml")).get("defaults", []):
        if isinstance(item, str) and os.path.isfile(os.path.join(root, f"{item}.yaml")):
            groups |= entry_groups(item)
        elif not isinstance(item, str):
            groups |= {str(k) for k in item if not str(k).startswith("override ")}
    return groups


def groups_listing(entry):
    """The config groups of configs/<entry>.yaml and their options, one line each (for --help)."""
    lines = []
    for group in sorted(entry_groups(entry)):
        folder = os.path.join(config_dir(), group)
        options = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".yaml") and not n.startswith("_"))
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)
