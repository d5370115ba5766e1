"""An output file given on the command line (results_file=, out=) never replaces an input or a file of another kind."""

import os

from ..errors import ConfigError


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
