"""Compile the adder Triton kernels for a GPU target without a GPU and report their SASS.

For every tile config: registers, stack (spills), shared memory, number of distinct layouts and
layout conversions in the TTGIR, and the instruction mix of the hottest loop (the share of FP
instructions there is the ceiling on CUDA-core efficiency). Needs triton's bundled ptxas and
cuobjdump only.  Usage: python scripts/triton_sass_report.py [--arch 90] [--dtype fp32]
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from addernet.ops.kernels import triton as tk  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)")


def sass_stats(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        res = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([f"{BIN}/cuobjdump", "--dump-sass", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    get = lambda k: int(m.group(1)) if (m := re.search(rf"{k}:(\d+)", res)) else -1
    addr, ops = [], []
    for line in sass.splitlines():
        if m := INSN.match(line):
            addr.append(int(m.group(1), 16))
            ops.append((m.group(2).split(".")[0], m.group(3)))
    loops = []  # backward branches delimit loop bodies
    for k, (op, rest) in enumerate(ops):
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr[k] and int(t.group(1), 16) in addr:
            loops.append(ops[addr.index(int(t.group(1), 16)):k + 1])
    hot = max(loops, key=len) if loops else []
    hist = collections.Counter(op for op, _ in hot)
    fp = sum(hist[o] for o in ("FADD", "FFMA", "FMUL", "FMNMX", "FSEL"))
    return dict(regs=get("REG"), stack=get("STACK"), shared=get("SHARED"), loop=len(hot), fp=fp, hist=hist)


def signature(kernel, dtype):
    sig = {}
    for name in kernel.arg_names:
        p = kernel.params[kernel.arg_names.index(name)]
        sig[name] = "constexpr" if p.is_constexpr else ("*" + dtype if name.endswith("_ptr") else "i32")
    if kernel is tk._dgrad_kernel:
        sig["w_ptr"] = "*fp32"
    return sig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    a = ap.parse_args()
    shapes = {"3x3 s1 p1": dict(KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1),
              "1x1 s1 p0": dict(KH=1, KW=1, SH=1, SW=1, PH=0, PW=0, DH=1, DW=1)}
    print(f"{'kernel':6} {'conv':10} {'RM,RN,TM,TN,w':14} {'regs':>4} {'stack':>5} {'smem':>5} {'layouts':>7} "
          f"{'cvt':>3} {'loop':>5} {'FP%':>4}  top ops in hot loop")
    for kname, kernel in (("fwd", tk._fwd_kernel), ("dgrad", tk._dgrad_kernel)):
        for sname, conv in shapes.items():
            for rm, rn, tm, tn, nw in (tk._FWD_CONFIGS if kname == "fwd" else tk._DGRAD_CONFIGS):
                const = dict(conv, RM=rm, RN=rn, TM=tm, TN=tn)
                src = ASTSource(fn=kernel, signature=signature(kernel, a.dtype), constexprs=const)
                c = triton.compile(src, target=GPUTarget("cuda", a.arch, 32), options=dict(num_warps=nw, num_stages=1))
                s = sass_stats(c.asm["cubin"])
                ttgir = c.asm["ttgir"]
                nlay = len(set(re.findall(r"#blocked\d* = ", ttgir)))
                ncvt = ttgir.count("convert_layout")
                top = " ".join(f"{k}:{v}" for k, v in s["hist"].most_common(6))
                print(f"{kname:6} {sname:10} {f'{rm},{rn},{tm},{tn},{nw}':14} {s['regs']:4} {s['stack']:5} {s['shared']:5} "
                      f"{nlay:7} {ncvt:3} {s['loop']:5} {100 * s['fp'] / max(s['loop'], 1):4.0f}  {top}", flush=True)


if __name__ == "__main__":
    main()
