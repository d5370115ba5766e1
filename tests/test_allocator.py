"""trainer.retain_freed_memory (addernet/engine/allocator.py): freed memory is kept for reuse, not faulted back in."""

import platform
import subprocess
import sys

import pytest

from helpers import child_env

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a step's pattern: three 8 MiB activations written, then freed, eight times; prints the page faults of each round
PATTERN = """
import resource, sys, torch
if sys.argv[1] == "retain":
    from addernet.engine.allocator import retain_freed_memory
    assert retain_freed_memory()
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(2 << 20) for _ in range(3)]
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""
BLOCK = 2048  # pages of one 8 MiB block


def _faults(mode):
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(v) for v in out.stdout.split()]


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's (mallopt); other C libraries are left alone")
def test_retained_memory_is_not_faulted_back_in():
    """Against glibc's defaults in a fresh process of each, after the first round (which faults the blocks in): with
    the defaults the freed blocks are faulted in again round after round; retained, at most one block's pages in all,
    where the heap grows once past a small allocation that landed at its top."""
    default = sum(_faults("default")[1:])
    if default < 3 * BLOCK:
        pytest.skip(f"this glibc kept the freed blocks by itself ({default} page faults): nothing to compare against")
    assert sum(_faults("retain")[1:]) <= BLOCK + 64


@pytest.mark.parametrize("retain", [True, False])
def test_a_run_applies_the_setting_only_when_asked(monkeypatch, cfg_train, tmp_path, retain):
    from addernet.engine import parts

    calls = []
    monkeypatch.setattr(parts, "retain_freed_memory", lambda: calls.append(1) or True)
    cfg_train.trainer.retain_freed_memory = retain
    cfg_train.trainer.epochs = 1
    from addernet.engine import train

    train(cfg_train, str(tmp_path / "run"))
    assert calls == ([1] if retain else [])
