"""Compile the plain-C adder kernels on first use and load them with ctypes: the one loader of both libraries.

The C file has no torch headers, so it builds in a few seconds with the system compiler instead
of the minute a torch C++ extension takes. The shared object is cached per user under
$ADDERNET_CACHE_DIR (default $XDG_CACHE_HOME/addernet, i.e. ~/.cache/addernet), named by a
hash of the sources, compiler, flags and CPU, so a changed kernel or machine rebuilds itself.
It is written to a temporary file and renamed into place, so concurrent processes (torchrun
ranks) are safe. Delete the cache directory (or set ADDERNET_REBUILD=1) to force a rebuild;
set CC to choose the compiler. ADDERNET_KERNEL_SOURCES=DIR builds the libraries from the C sources in DIR
instead of this package's (another checkout's addernet/ops/kernels, with the same functions and structs): a
benchmark then compares two versions of the kernels in one process (scripts/bench_adder.py --against).

ADDERNET_CPU_ISA (or the `isa` argument) chooses the instruction set the kernels are compiled for:
native (default: -march=native, the best path this CPU has), or one of avx512, avx2, sse2, scalar to
build a lower path than the host's, so that one machine can test every path (scalar is the plain-C
code other architectures run). A path is compiled on any x86-64 host; loading one whose CPU flags
this machine lacks raises BuildError naming the missing flag instead of crashing on an illegal
instruction. avx512-emulated runs the AVX-512 path's code on an AVX2 host, through SIMDe's AVX-512
intrinsics (emulate_avx512.h): slow, for tests only.

It is built with -fopenmp when the compiler supports it: the library then links libgomp.so.1, and
the dynamic loader hands it the copy torch already loaded, so the kernels run on torch's own
OpenMP threads instead of a second pool that would fight torch's spin-waiting workers for the cores.

The C boundary: both libraries include isa.h (the instruction set, adder_path(), adder_openmp()) and
geometry.h (the layer geometry struct, mirrored by Geometry below); `library` loads one, declares its
functions' argument and result types and checks that every struct has the size the C code gives it.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from ...errors import BuildError, ConfigError
from ..conv_args import out_hw

# library name -> its sources (the first is compiled; the rest are headers it includes)
SHARED = ("isa.h", "geometry.h")
SOURCES = {
    "adder_cpu": ("adder_cpu.c", "adder_cpu_body.h", *SHARED),
    "adder_int": ("adder_int.c", "adder_intnet_body.h", *SHARED),
}
FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11")  # no -ffast-math: see adder_cpu.c
# instruction set -> (compiler flags, /proc/cpuinfo flags a CPU needs to run the result); the x86-64-vN
# levels are the psABI's, and their flags are those levels' required features
ISAS = {
    "native": (("-march=native",), ()),
    "avx512": (("-march=x86-64-v4", "-mtune=native"), ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    "avx2": (("-march=x86-64-v3", "-mtune=native"), ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")),
    "sse2": (("-march=x86-64", "-mtune=native"), ("sse2",)),
    "scalar": (("-march=x86-64", "-mtune=native", "-DADDERNET_PLAIN_C"), ()),
    # the AVX-512 path's code compiled for AVX2 through SIMDe's emulation of the AVX-512 intrinsics: for tests on a
    # host without AVX-512 (emulate_avx512.h; docs/testing.md)
    "avx512-emulated": (("-march=x86-64-v3", "-mtune=native", "-DADDERNET_EMULATE_AVX512"), ("avx2", "fma")),
}
EMULATION = "emulate_avx512.h"  # a source of the avx512-emulated builds only (an older checkout may lack it)
OPENMP = ("-fopenmp",)  # tried first; without it the kernels run on a Python thread pool (cpu.py)


def kernel_sources():
    """The folder the C sources are compiled from: $ADDERNET_KERNEL_SOURCES, else this package's (ConfigError if that
    folder lacks them). Called on every kernel call, so the answer for a folder is kept."""
    src = os.environ.get("ADDERNET_KERNEL_SOURCES")
    return _other_sources(src) if src else _HERE


_HERE = Path(__file__).parent


@functools.lru_cache(maxsize=None)
def _other_sources(src):
    missing = [f for f in {f for files in SOURCES.values() for f in files} if not (Path(src) / f).is_file()]
    if missing:
        raise ConfigError(
            f"ADDERNET_KERNEL_SOURCES={src} lacks {', '.join(sorted(missing))}: point it at a checkout's "
            "addernet/ops/kernels, or unset it"
        )
    return Path(src).resolve()


def cache_dir():
    root = os.environ.get("ADDERNET_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "addernet"


def _cpuinfo_line(key):
    """The first line of /proc/cpuinfo that starts with `key` ("" if none), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(key)), "")
    except OSError:
        return None


def _cpu_fingerprint():
    # -march=native output depends on the CPU; a shared home may be mounted on other machines
    line = _cpuinfo_line("flags")
    return os.uname().machine if line is None else line


def cpu_isa(isa=None):
    """The instruction set to build for: `isa`, else $ADDERNET_CPU_ISA, else native (ConfigError if unknown)."""
    isa = isa or os.environ.get("ADDERNET_CPU_ISA") or "native"
    if isa not in ISAS:
        raise ConfigError(f"ADDERNET_CPU_ISA={isa!r} is not one of {', '.join(ISAS)}; unset it to use native")
    return isa


def missing_cpu_flags(isa):
    """The CPU flags `isa` needs that this machine lacks (all of them when it is not x86-64)."""
    have = set(_cpu_fingerprint().split(":", 1)[-1].split())
    if isa != "native" and platform.machine() not in ("x86_64", "AMD64"):
        return [f"x86-64 (this is {platform.machine()})"]
    return [flag for flag in ISAS[isa][1] if flag not in have]


def cpu_info():
    """(CPU model name, its flags) from /proc/cpuinfo; ("", set()) where there is none."""
    line = _cpuinfo_line("model name")
    return (line.split(":", 1)[1].strip() if line else ""), set(_cpu_fingerprint().split(":", 1)[-1].split())


def machine(threads):
    """One line for benchmark output: CPU model, the kernels' instruction set, threads, load average."""
    model, flags = cpu_info()
    simd = " ".join(f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "amx_tile") if f in flags)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"CPU {model or platform.machine()} ({simd or 'no AVX2/AVX-512'}) | kernels ADDERNET_CPU_ISA={cpu_isa()} | "
        f"{threads} threads | load average {load}"
    )


def built_or(module, fallback, what, instead):
    """``module`` when its C kernel builds and loads (``module.available()``), else ``fallback`` after one
    RuntimeWarning: ``addernet: <what> unavailable (<why>); <instead>``."""
    try:
        module.available()
        return module
    except BuildError as e:
        warnings.warn(f"addernet: {what} unavailable ({e}); {instead}", RuntimeWarning)
        return fallback


def load_library(name="adder_cpu", isa=None):
    """Return the ctypes library `name` (adder_cpu: float kernels, adder_int: the integer kernel of
    quantised layers) built for `isa` (see cpu_isa), compiling it into the cache first if needed
    (raises BuildError, also when this CPU cannot run that instruction set)."""
    isa = cpu_isa(isa)
    missing = missing_cpu_flags(isa)
    if missing:
        raise BuildError(
            f"the {isa} kernel needs CPU flag {', '.join(missing)}, which this CPU lacks; "
            "unset ADDERNET_CPU_ISA or choose a lower one"
        )
    return _load(name, isa, kernel_sources())


@functools.lru_cache(maxsize=None)
def _load(name, isa, src):
    target = build_library(name, isa)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise BuildError(f"cannot load {target}: {e}") from e


class Geometry(ctypes.Structure):
    """One adder layer call's shape: geometry.h's adder_geometry, field for field, passed to every kernel of both
    libraries. Cgp is the float kernels' padded channels per group, Kp the integer kernel's patch row length; each
    kernel leaves the other's at 0. wimg and ygs (float kernels, l1_scores) default to 0: one weight for all images,
    output groups Og channels apart."""

    _fields_ = [
        (name, ctypes.c_int64)
        for name in ("N", "C", "H", "W", "G", "Cg", "Og", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw", "Ho", "Wo")
        + ("Cgp", "Kp", "Opad", "wimg", "ygs")
    ]

    @classmethod
    def of(cls, x_shape, w_shape, stride, padding, dilation, groups, **padded):
        """The geometry of input ``x_shape`` (N, C, H, W) against weight ``w_shape`` (O, C/groups, kh, kw), with the
        padded sizes (Cgp, Kp, Opad) given by the kernel."""
        (n, c, h, w), (o, cg, kh, kw) = x_shape, w_shape
        ho, wo = out_hw(x_shape, w_shape, stride, padding, dilation)
        return cls(n, c, h, w, groups, cg, o // groups, kh, kw, *stride, *padding, *dilation, ho, wo, **padded)


# what every library exports (isa.h, geometry.h): name -> (result type, argument types)
COMMON = {
    "adder_path": (ctypes.c_char_p, ()),
    "adder_openmp": (ctypes.c_int, ()),
    "adder_geometry_size": (ctypes.c_int, ()),
}


def library(name, functions, structs=()):
    """Library ``name`` built for the instruction set chosen now (cpu_isa: $ADDERNET_CPU_ISA), with COMMON's and
    ``functions``' (name -> (result type, argument types)) types declared and each of ``structs`` ((C function
    returning its size, ctypes type) pairs; Geometry always) checked against the C code. Raises BuildError."""
    isa, src = cpu_isa(), kernel_sources()
    lib = _declared.get((name, isa, src))
    if lib is None:
        lib = load_library(name, isa)
        for fn, (restype, argtypes) in {**COMMON, **functions}.items():
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
        for size, struct in (("adder_geometry_size", Geometry), *structs):
            if getattr(lib, size)() != ctypes.sizeof(struct):
                raise BuildError(f"{name}: the C code and {struct.__name__} disagree on its layout ({size})")
        _declared[name, isa, src] = lib
    return lib


_declared = {}  # (library, isa, source folder) -> the library with its functions declared


def amd_cpu():
    """True on an AMD CPU: the float kernels then issue x - w on the FMA pipes (adder_cpu.c, "Port balance")."""
    return "AuthenticAMD" in (_cpuinfo_line("vendor_id") or "")


def build_library(name="adder_cpu", isa=None):
    """Compile library `name` for `isa` into the cache if needed and return its path, without loading it
    (so a path this CPU cannot run is still compile-checked). Raises BuildError."""
    isa = cpu_isa(isa)
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise BuildError(f"C compiler {cc!r} not found")
    flags = FLAGS + ISAS[isa][0] + (("-DADDERNET_SUB_ON_FMA=1",) if amd_cpu() else ())
    try:
        return _build(cc, flags + OPENMP, name)
    except BuildError:  # a compiler without OpenMP: the serial build still works
        return _build(cc, flags, name)


def _build(cc, flags, name="adder_cpu"):
    here = kernel_sources()
    sources = SOURCES[name] + ((EMULATION,) if "-DADDERNET_EMULATE_AVX512" in flags else ())
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
    return target
