"""Compile the adder Triton kernels for a GPU target without a GPU and report their SASS.

Each kernel is compiled exactly as a real launch would compile it: the arguments come from the
host code (`forward` / `grad_input` run on CPU tensors of a real layer shape, the launch is
intercepted) and go through Triton's own specialisation (ints equal to 1 become constants, ints
divisible by 16 and 16-byte-aligned pointers get the divisibility attribute). For every tile
config: registers, stack (spills), shared memory, distinct layouts and layout conversions in the
TTGIR, and the instruction mix of the hottest loop (the share of FP instructions there is the
ceiling on CUDA-core efficiency). Needs only triton's bundled ptxas and cuobjdump.

    python -m addernet.tools.triton_sass_report [--arch 90] [--dtype float32] [--shapes all|resnet50|resnet20]
"""

import argparse
import collections
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource

from ..errors import reported
from ..ops.kernels import triton as tk

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)")
# (name, batch, cin, cout, size, kernel, stride, padding): a subset of scripts/bench_gpu.py's shapes
SHAPES = {
    "resnet20": [
        ("r20 16->16 32x32", 256, 16, 16, 32, 3, 1, 1),
        ("r20 64->64 8x8", 256, 64, 64, 8, 3, 1, 1),
        ("r20 1x1 16->32 s2", 256, 16, 32, 32, 1, 2, 0),
    ],
    "resnet50": [
        ("r50 3x3 64 56x56", 64, 64, 64, 56, 3, 1, 1),
        ("r50 3x3 256 14x14", 64, 256, 256, 14, 3, 1, 1),
        ("r50 1x1 256->64 56x56", 64, 256, 64, 56, 1, 1, 0),
    ],
}


def sass_stats(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        res = subprocess.run(
            [f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
        sass = subprocess.run([f"{BIN}/cuobjdump", "--dump-sass", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)

    def get(k):
        m = re.search(rf"{k}:(\d+)", res)
        return int(m.group(1)) if m else -1

    addr, ops = [], []
    for line in sass.splitlines():
        if m := INSN.match(line):
            addr.append(int(m.group(1), 16))
            ops.append((m.group(2).split(".")[0], m.group(3)))
    loops = []  # backward branches delimit loop bodies
    for k, (op, rest) in enumerate(ops):
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr[k] and int(t.group(1), 16) in addr:
            loops.append(ops[addr.index(int(t.group(1), 16)) : k + 1])
    hot = max(loops, key=len) if loops else []
    hist = collections.Counter(op for op, _ in hot)
    fp = sum(hist[o] for o in ("FADD", "FFMA", "FMUL", "FMNMX", "FSEL"))
    return dict(regs=get("REG"), stack=get("STACK"), shared=get("SHARED"), loop=len(hot), fp=fp, hist=hist)


def captured_launches(spec, dtype):
    """The (kernel, args, constexpr meta) that forward and grad_input would launch for this layer."""
    _, n, cin, cout, size, k, s, p = spec
    x = torch.randn(n, cin, size, size, dtype=dtype)
    w = torch.randn(cout, cin, k, k, dtype=dtype)
    conf = ((s, s), (p, p), (1, 1), 1)
    calls = []
    real = tk._launch
    tk._launch = lambda kernel, tuned, grid_fn, args, meta, config: calls.append((kernel, args, meta))
    try:
        y = tk.forward(x, w, *conf)
        tk.grad_input(x, w, torch.randn_like(y), *conf)
    finally:
        tk._launch = real
    return calls


def specialise(kernel, args, meta):
    """Triton's JIT specialisation of these arguments: signature, constexprs and attrs for ASTSource."""
    sig, const, attrs = {}, dict(meta), {}
    runtime = [
        name
        for name in kernel.arg_names
        if name not in meta and not kernel.params[kernel.arg_names.index(name)].is_constexpr
    ]
    for i, (name, value) in enumerate(zip(runtime, args)):
        ty, key = native_specialize_impl(BaseBackend, value, False, True, True)
        if ty == "constexpr":
            const[name] = value
        if key == "D":
            attrs[(kernel.arg_names.index(name),)] = [["tt.divisibility", 16]]
        sig[name] = ty
    for name in kernel.arg_names:
        if kernel.params[kernel.arg_names.index(name)].is_constexpr:
            sig[name] = "constexpr"
    return sig, const, attrs


def tile_stats(spec, dtype=torch.float32, arch=90, keep=lambda tile: True):
    """One dict per (kernel, tile) for this layer: registers, spills, layouts, SASS hot-loop mix."""
    rows = []
    for kernel, args, meta in captured_launches(spec, dtype):
        kname = "fwd" if kernel is tk._fwd_kernel else "dgrad"
        sig, const, attrs = specialise(kernel, args, meta)
        for rm, rn, tm, tn, nw in filter(keep, tk._FWD_CONFIGS if kname == "fwd" else tk._DGRAD_CONFIGS):
            src = ASTSource(fn=kernel, signature=sig, constexprs={**const, **tk._tile(rm, rn, tm, tn)}, attrs=attrs)
            c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=nw, num_stages=1))
            ttgir = c.asm["ttgir"]
            rows.append(
                dict(
                    sass_stats(c.asm["cubin"]),
                    kernel=kname,
                    layer=spec[0],
                    tile=(rm, rn, tm, tn, nw),
                    layouts=len(set(re.findall(r"#blocked\d* = ", ttgir))),
                    cvt=ttgir.count("convert_layout"),
                )
            )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--shapes", default="all", choices=["all", *SHAPES])
    a = ap.parse_args()
    shapes = [s for group, specs in SHAPES.items() if a.shapes in ("all", group) for s in specs]
    print(f"# triton {triton.__version__}, sm_{a.arch}, {a.dtype}, lanes-first dim order: {tk.LANES_FIRST}")
    print(
        f"{'kernel':6} {'layer':22} {'RM,RN,TM,TN,w':14} {'regs':>4} {'stack':>5} {'smem':>5} {'layouts':>7} "
        f"{'cvt':>3} {'loop':>5} {'FP%':>4}  top ops in hot loop"
    )
    for spec in shapes:
        for r in tile_stats(spec, getattr(torch, a.dtype), a.arch):
            top = " ".join(f"{k}:{v}" for k, v in r["hist"].most_common(6))
            print(
                f"{r['kernel']:6} {r['layer']:22} {','.join(map(str, r['tile'])):14} {r['regs']:4} {r['stack']:5} "
                f"{r['shared']:5} {r['layouts']:7} {r['cvt']:3} {r['loop']:5} "
                f"{100 * r['fp'] / max(r['loop'], 1):4.0f}  {top}",
                flush=True,
            )


if __name__ == "__main__":
    with reported("triton_sass_report.py"):
        main()
