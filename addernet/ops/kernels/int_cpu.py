"""Integer adder kernel (adder_int.c): y = sum |x - w| over unsigned 8/16-bit integers, int32 out.

The quantised layer (addernet/quant/qadder.py) maps its activations and weights onto non-negative
integers and calls this; the batch (or, for small batches, each image's output pixels) is split
across torch's OpenMP threads like the float kernel (cpu.py).
"""

import ctypes

import torch
import torch.nn.functional as F

from .build import Geometry, amd_cpu, library

LANES = {torch.uint8: 1, torch.uint16: 2}
SERIAL_WORK = 1 << 20  # abs-differences below which one thread is faster than waking the others


def _lib():
    """The kernel library for the instruction set chosen now (build.cpu_isa: $ADDERNET_CPU_ISA)."""
    return library("adder_int", FUNCTIONS, (("adder_intnet_op_size", IntnetOp),))


def path():
    """The compiled path in use: avx512, avx2, sse2 or plain C."""
    return _lib().adder_path().decode()


def available():
    """Build/load the kernel now; raises build.BuildError when it cannot be built."""
    _lib()
    return True


def _arr(values):
    return (ctypes.c_int64 * len(values))(*values)


def _splits(total, parts):
    step = -(-total // parts)
    return [(a, min(a + step, total)) for a in range(0, total, step)]


def pack_weight(w, groups):
    """Weight (O, Cg, kh, kw) -> [G][Opad][Kp] with K in (i, j, c) order, zero-padded (see adder_int.c)."""
    lib = _lib()
    o, cg, kh, kw = w.shape
    og, k = o // groups, cg * kh * kw
    kp = -(-k // lib.adder_int_row_align()) * lib.adder_int_row_align()
    opad = -(-og // lib.adder_int_filter_tile()) * lib.adder_int_filter_tile()
    wt = w.reshape(groups, og, cg, kh, kw).permute(0, 1, 3, 4, 2).reshape(groups, og, k)
    return F.pad(wt, (0, kp - k, 0, opad - og)).contiguous(), kp, opad


def forward(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, packed=None):
    """sum |x - w| as int32 (N, O, Ho, Wo) for x (N, C, H, W) and w (O, C/groups, kh, kw) of one
    unsigned integer dtype (uint8 or uint16); zero padding counts as 0. `packed` reuses pack_weight(w)."""
    if x.dtype not in LANES or w.dtype != x.dtype:
        raise TypeError(
            f"integer adder kernel needs uint8 or uint16 input and weight of one dtype, got {x.dtype} and {w.dtype}"
        )
    if x.dim() != 4 or w.dim() != 4 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ValueError(
            f"integer adder kernel: input {tuple(x.shape)} does not fit weight {tuple(w.shape)} with groups={groups}"
        )
    wt, kp, opad = packed if packed is not None else pack_weight(w, groups)
    s = Geometry.of(x.shape, w.shape, stride, padding, dilation, groups, Kp=kp, Opad=opad)
    n, ho, wo, k = s.N, s.Ho, s.Wo, s.Cg * s.kh * s.kw
    if ho < 1 or wo < 1:
        raise ValueError(f"integer adder kernel: padded input {s.H}x{s.W} is smaller than the kernel {s.kh}x{s.kw}")
    if k * (2 ** (8 * LANES[x.dtype]) - 1) >= 2**31:
        raise ValueError(f"integer adder kernel: K={k} terms of {x.dtype} could overflow int32")
    x = x.contiguous()
    y = torch.empty(n, w.shape[0], ho, wo, dtype=torch.int32)
    if y.numel() == 0:
        return y
    workers = torch.get_num_threads() if y.numel() * k >= SERIAL_WORK else 1
    if n >= workers:
        ranges = [(a, b, 0, ho * wo) for a, b in _splits(n, workers)]
    else:  # small batch: split each image's output pixels instead
        ranges = [(i, i + 1, a, b) for i in range(n) for a, b in _splits(ho * wo, workers)]
    flat = [v for r in ranges for v in r]
    status = _lib().adder_int_forward(
        x.data_ptr(), wt.data_ptr(), y.data_ptr(), s, LANES[x.dtype], _arr(flat), len(ranges), workers
    )
    if status:
        raise MemoryError("integer adder kernel could not allocate its per-image scratch buffer")
    return y


# ---- integer network (adder_int.c, "Integer network"): ops built by addernet/quant/intnet.py ----------

OP_ADDER, OP_ENTRY = 0, 1
MAX_OUTPUTS = 8  # quantised outputs per op (adder_int.c MAXQ; the op size check catches a difference)
MAX_BUFFERS = 256  # adder_int.c MAXBUF


# the integer fields of adder_int.c's intnet_op, in order
INT_FIELDS = (
    "kind",
    "C",
    "H",
    "W",
    "O",
    "kh",
    "kw",
    "sh",
    "sw",
    "ph",
    "pw",
    "Ho",
    "Wo",
    "Kp",
    "n_tiles",
    "n_planes",
    "in_buf",
    "out_buf",
    "res_buf",
    "relu",
    "n_q",
    "lv",
    "border",
    "direct",
)


class IntnetOp(ctypes.Structure):
    """One op of the integer network; field for field adder_int.c's intnet_op."""

    _fields_ = [(n, ctypes.c_int64) for n in INT_FIELDS] + [
        ("q_buf", ctypes.c_int64 * MAX_OUTPUTS),
        ("inv", ctypes.c_double * MAX_OUTPUTS),
        ("w", ctypes.c_void_p),
        ("in_planes", ctypes.c_void_p),
        ("tile_plane", ctypes.c_void_p),
        ("tile_first", ctypes.c_void_p),
        ("chan", ctypes.c_void_p),
        ("alpha", ctypes.c_void_p),
        ("beta", ctypes.c_void_p),
    ]


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# adder_int.c's functions: name -> (result type, argument types)
FUNCTIONS = {
    "adder_int_forward": (_INT, (_P, _P, _P, ctypes.POINTER(Geometry), _INT, _P, _I64, _INT)),
    "adder_int_row_align": (_INT, ()),
    "adder_int_filter_tile": (_INT, ()),
    "adder_int_pixel_tile": (_INT, ()),
    "adder_intnet_forward": (_INT, (_P, _I64, _INT, _P, _I64, _P, _I64, _I64, _P, _I64, _P, _I64, _I64, _INT)),
    "adder_intnet_op_size": (_INT, ()),
    "adder_intnet_direct_row": (_INT, (_I64, _I64, _I64, _INT)),
    "adder_intnet_lanes": (_INT, (_I64, _I64, _I64, _INT)),
}


def filter_tile():
    return _lib().adder_int_filter_tile()


def direct_row(channels, kh, kw, lane):
    """Weight bytes per kernel row when the integer network's AVX-512 tiles read a layer's input planes in place
    by kernel rows (adder_int.c sad_direct_u8), or 0."""
    return _lib().adder_intnet_direct_row(channels, kh, kw, LANES[lane])


def lanes(channels, kh, kw, lane):
    """True when the integer network's tiles read a layer's input planes in place with the filters across the
    vector lanes (adder_int.c sad_lanes_u8): weights packed per filter tile as K/8 steps of [filters][8] bytes.

    The tile is 256 bits wide. With AVX-512 it is chosen on AMD CPUs, whose cores run a 512-bit instruction as two
    256-bit halves, so the kernel-row tile's wider vpsadbw gains nothing there and its fold and padding cost; an
    Intel core sums 64 bytes per vpsadbw, so it keeps the kernel-row tile (docs/quantization.md)."""
    can = bool(_lib().adder_intnet_lanes(channels, kh, kw, LANES[lane]))
    return can and (path() != "avx512" or amd_cpu())


def row_align():
    return _lib().adder_int_row_align()


def pixel_tile():
    return _lib().adder_int_pixel_tile()


def run_network(ops, lane, x, out, buf_off, ws_bytes, rows_off, threads=None):
    """Run the ops (a ctypes array of IntnetOp) on x (N, ...) float32 into out (N, ...) float32, both
    contiguous; buf_off[b] is buffer b's byte offset in a per-thread area of ws_bytes, rows_off the
    gather rows' offset there. Batch >= threads: images split across threads; smaller: pixels."""
    nt = threads or torch.get_num_threads()
    n = x.shape[0]
    ws = torch.empty(nt * ws_bytes, dtype=torch.uint8)
    offs = torch.tensor(buf_off, dtype=torch.int64)
    _lib().adder_intnet_forward(
        ctypes.addressof(ops),
        len(ops),
        LANES[lane],
        x.data_ptr(),
        x[0].numel() if n else 0,
        out.data_ptr(),
        out[0].numel() if n else 0,
        n,
        offs.data_ptr(),
        len(buf_off),
        ws.data_ptr(),
        ws_bytes,
        rows_off,
        nt,
    )
    return out
