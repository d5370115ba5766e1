"""Checks of what a user gives, in one message style naming the key and the fix: config values (shared by the
schema's classes) and the output files of the tools (an output never replaces a file the project did not write
unless the user says so).

``node`` is a config node (``node.get(key)``) or a schema dataclass instance (``getattr(node, key)``).
"""

import json
import math
import os

from .errors import ConfigError


def _get(node, key):
    return node.get(key) if hasattr(node, "get") else getattr(node, key, None)


def number(node, key, name, minimum=0, positive=False, integer=False, example=None):
    """node[key] as a finite number >= minimum (> 0 with ``positive``); ``name`` is the dotted key for messages,
    ``example`` the value its message suggests (default: the smallest allowed)."""
    value = _get(node, key)
    kinds = (int,) if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or value < minimum
        or (positive and value == 0)
    ):
        if integer:
            raise ConfigError(
                f"{name} must be an integer >= {max(minimum, int(positive))}, got {value!r}; "
                f"e.g. {name}={max(minimum, 1) if example is None else example}."
            )
        raise ConfigError(f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}.")
    return value


def choice(node, key, name, choices):
    """node[key], which must be one of ``choices`` (a bare YAML/CLI ``off`` that became false counts as "off")."""
    value = _get(node, key)
    if value is False and "off" in choices:
        value = "off"
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}.")
    return value


def output_file(path, option, ours=None, overwrite=False, flag="--overwrite"):
    """``path``, the output file that ``option`` (``--csv``, ``out=``) names, checked before any work: ConfigError
    (one line) when it is a folder, or an existing non-empty file that this command did not write (``ours(path)``
    false or no ``ours``) and ``overwrite`` (the user's ``flag``) is not set. Its folder is created
    (:func:`output_folder`)."""
    path = os.fspath(path)
    name = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    if os.path.isdir(path):
        raise ConfigError(f"{name} is a folder; give a file path.")
    mine = overwrite or not os.path.lexists(path) or (os.path.isfile(path) and os.path.getsize(path) == 0)
    if not (mine or (ours is not None and os.path.isfile(path) and ours(path))):
        raise ConfigError(
            f"{name}: that file exists and was not written by this command; it is not replaced. Give another path, "
            f"or add {flag} to replace it."
        )
    output_folder(path, option)
    return path


def output_folder(path, option):
    """Create the folder of the output file ``path`` (named by ``option``); ConfigError (one line) when it cannot be
    created or written to."""
    name = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{name}: cannot create its folder {folder} ({e.strerror}); give a writable path.") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: its folder {folder} is not writable; give a writable path.")


def json_with(*keys):
    """An ``ours`` test of :func:`output_file` for a JSON output: the file holds an object with ``keys`` (or a list
    of such objects)."""

    def ours(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return False
        return all(isinstance(d, dict) and set(keys) <= set(d) for d in (data if isinstance(data, list) else [data]))

    return ours
