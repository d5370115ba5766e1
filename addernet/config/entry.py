"""One handler for every entry point: compose with Hydra, run, and report a bad command line in one line.

Hydra's own errors (an unknown key, a wrong type, a missing option) are multi-line and exit 1; here they
are one line with the closest valid key, exit 2, like every other error of a user's input.
"""

import os
import sys

import hydra
from hydra.errors import HydraException
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
            message = one_line(e)
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))


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
