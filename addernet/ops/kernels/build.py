"""Compile the plain-C adder kernel on first use and load it with ctypes.

The C file has no torch headers, so it builds in a few seconds with the system compiler instead
of the minute a torch C++ extension takes. The shared object is cached per user under
$ADDERNET_CACHE_DIR (default $XDG_CACHE_HOME/addernet, i.e. ~/.cache/addernet), named by a
hash of the sources, compiler, flags and CPU, so a changed kernel or machine rebuilds itself.
It is written to a temporary file and renamed into place, so concurrent processes (torchrun
ranks) are safe. Delete the cache directory (or set ADDERNET_REBUILD=1) to force a rebuild;
set CC to choose the compiler.

It is built with -fopenmp when the compiler supports it: the library then links libgomp.so.1, and
the dynamic loader hands it the copy torch already loaded, so the kernels run on torch's own
OpenMP threads instead of a second pool that would fight torch's spin-waiting workers for the cores.
"""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...errors import BuildError

# library name -> its sources (the first is compiled; the rest are headers it includes)
SOURCES = {"adder_cpu": ("adder_cpu.c", "adder_cpu_body.h"), "adder_int": ("adder_int.c", "adder_intnet_body.h")}
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11")  # no -ffast-math: see adder_cpu.c
OPENMP = ("-fopenmp",)  # tried first; without it the kernels run on a Python thread pool (cpu.py)


def cache_dir():
    root = os.environ.get("ADDERNET_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "addernet"


def _cpu_fingerprint():
    try:  # -march=native output depends on the CPU; a shared home may be mounted on other machines
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return os.uname().machine


@functools.lru_cache(maxsize=None)
def load_library(name="adder_cpu"):
    """Return the ctypes library `name` (adder_cpu: float kernels, adder_int: the integer kernel of
    quantised layers), compiling it into the cache first if needed (raises BuildError)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise BuildError(f"C compiler {cc!r} not found")
    try:
        return _build(cc, FLAGS + OPENMP, name)
    except BuildError:  # a compiler without OpenMP: the serial build still works
        return _build(cc, FLAGS, name)


def _build(cc, flags, name="adder_cpu"):
    here = Path(__file__).parent
    sources = SOURCES[name]
    key = hashlib.sha256()
    for source in sources:
        key.update((here / source).read_bytes())
    key.update(" ".join((shutil.which(cc),) + flags).encode())
    key.update(_cpu_fingerprint().encode())
    target = cache_dir() / f"{name}_{key.hexdigest()[:16]}.so"
    if os.environ.get("ADDERNET_REBUILD") == "1" or not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            cmd = [cc, *flags, str(here / sources[0]), "-o", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise BuildError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise BuildError(f"cannot load {target}: {e}") from e
