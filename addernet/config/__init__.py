"""The configuration: its schema (Hydra structured configs), where the YAML files are, and one-line errors.

schema.py    every group's keys, types, defaults and meanings as Hydra structured configs
validate.py  the composed config against the schema; one-line messages of OmegaConf's errors
entry.py     the one handler of every entry point: one-line errors, exit codes
docs.py      writes docs/configuration.md from the schema and the YAML options
"""

import os

from .schema import register

register()

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config_dir():
    """The folder of train.yaml and the config groups: a checkout's configs/, else the installed package's copy."""
    for path in (os.path.join(os.path.dirname(_PACKAGE), "configs"), os.path.join(_PACKAGE, "configs")):
        if os.path.isfile(os.path.join(path, "train.yaml")):
            return path
    raise FileNotFoundError(f"no configs/ next to {_PACKAGE}: a broken installation of addernet")


__all__ = ["config_dir", "register"]
