"""trainer.retain_freed_memory: glibc keeps the memory a training step frees, for the next step to reuse.

With its defaults glibc hands large freed blocks back to the system (unmapped on free, or trimmed off the top of
the heap), and a training step, which frees and allocates the same activations every step, then faults them back
in: thousands of page faults per step in some processes, up to 15% of a CPU step, differing from process to
process (docs/benchmarks.md). Retained, blocks up to 32 MiB come from the heap and the heap is never trimmed, as
``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647`` would set before
the process starts; the cost is memory the process keeps after its peak. Other C libraries are left alone.
"""

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
NEVER_TRIM = 2**31 - 1  # the largest int mallopt takes


def mallopt(param, value):
    """glibc's ``mallopt(param, value)`` in this process: True when it took the setting, False where it did not or
    the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    fn = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own C library
    if fn is None:
        return False
    fn.argtypes, fn.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(fn(param, value))


def retain_freed_memory():
    """Tell glibc to keep freed memory for reuse (the module docstring); True when it took the settings, False
    where the C library is not glibc."""
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)
