"""Config value checks shared by the schema's classes: one message style, naming the key and the fix.

``node`` is a config node (``node.get(key)``) or a schema dataclass instance (``getattr(node, key)``).
"""

import math

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
