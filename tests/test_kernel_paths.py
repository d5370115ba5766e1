"""Every compiled path of the C kernels (AVX-512, AVX2, SSE2, plain C; build.py's ADDERNET_CPU_ISA) on
this host: each is compiled; each this CPU can run is checked against the float64 references (float
forward and every gradient, integer kernel, integer network); a path it cannot run is skipped with
the missing CPU flag. The test ids name the path, so the output says which paths ran."""

import ctypes
import functools
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from addernet import adder2d, adder_linear, l1_scores
from addernet.errors import BuildError, ConfigError
from addernet.ops.kernels import build, cpu, int_cpu
from addernet.ops.reference import adder2d_reference
from addernet.quant import IntegerResNet

from helpers import (
    REPO,
    child_env,
    int_reference,
    max_rel_error,
    quantised_reference,
    quantised_resnet20,
    random_images,
)

# ISA -> the path it reports; avx512-emulated is the AVX-512 path's code on an AVX2 host (SIMDe's intrinsics)
PATHS = {"avx512": "avx512", "avx2": "avx2", "sse2": "sse2", "scalar": "plain C", "avx512-emulated": "avx512"}


@pytest.fixture(params=list(PATHS))
def isa(request, monkeypatch):
    """Compile both kernel libraries for the ISA, then select it for the test (skip if this CPU cannot run it);
    two threads and no serial cut-off, so the batch and pixel splits run on every path."""
    name = request.param
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the {name} path is x86-64 code; this host is {platform.machine()}")
    if name == "avx512-emulated" and not build.missing_cpu_flags("avx512"):
        pytest.skip("the avx512 path runs natively on this CPU: no emulation needed")
    for lib in build.SOURCES:
        try:
            build.build_library(lib, name)  # compile check on any x86-64 host (raises BuildError)
        except BuildError as e:
            if name == "avx512-emulated" and "SIMDe" in str(e):
                pytest.skip("avx512-emulated needs SIMDe's headers (apt install libsimde-dev): docs/testing.md")
            raise
    missing = build.missing_cpu_flags(name)
    if missing:
        pytest.skip(f"{name} path compiled only: this CPU lacks {', '.join(missing)}")
    monkeypatch.setenv("ADDERNET_CPU_ISA", name)
    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    monkeypatch.setattr(cpu, "SERIAL_WORK", 0)
    monkeypatch.setattr(int_cpu, "SERIAL_WORK", 0)
    assert cpu.path() == PATHS[name] and int_cpu.path() == PATHS[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield name
    torch.set_num_threads(threads)


def _fwd_bwd(x, w, conf, gy, backend, monkeypatch):
    monkeypatch.setenv("ADDERNET_BACKEND", backend)
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = adder2d(x, w, None, *conf)
    return (y.detach(), *torch.autograd.grad(y, (x, w), gy))


# (N, Cin, Cout, H, W, kernel, stride, padding, dilation, groups): channel tails and both output-block
# widths of every vector length, groups, depthwise, batch 1 (pixels split across threads), batch 1 with
# 3 groups (groups split unevenly across threads) and batch 3; the forward's three ways to read an image: in
# place (unpadded, also strided), a zero-bordered copy in the input's order, and (over 64 NCHW channels) a
# channels-last copy (NCHW <-> channels-last copies with blocks of 8 x 8 and tails); over 256 output channels (the
# input gradient packs every tile of g); NCHW 1x1 layers along their pixels (whole vectors of them, the tail in the
# tiles), at stride 2 from a copy of the pixels they read, over more channels than are summed in registers at once,
# and over 64 channels (read in place, where another layer's image would be copied channels-last); NCHW layers of
# up to 16 channels per group along their pixels (rows of whole vectors, the last rows in the tiles; a tail of output
# channels; groups, dilation, batch 1)
FLOAT_CASES = [
    (2, 5, 260, 4, 6, (3, 3), 1, 1, 1, 1),
    (3, 40, 72, 9, 11, (3, 3), 2, 1, 1, 2),
    (1, 6, 5, 7, 6, (3, 1), 1, 2, 2, 1),
    (2, 4, 8, 5, 5, (3, 3), 1, 1, 1, 4),
    (1, 19, 33, 6, 6, (1, 1), 1, 0, 1, 1),
    (1, 15, 51, 5, 7, (3, 3), 1, 1, 1, 3),
    (1, 48, 99, 4, 5, (1, 1), 1, 0, 1, 3),
    (2, 9, 20, 8, 7, (3, 3), 2, 0, 1, 1),
    (1, 72, 18, 5, 9, (3, 3), 1, 1, 1, 2),
    (2, 12, 22, 14, 12, (1, 1), 2, 0, 1, 1),
    (2, 40, 13, 6, 7, (1, 1), 1, 0, 1, 1),
    (2, 72, 16, 6, 6, (1, 1), 1, 0, 1, 1),
    (2, 12, 20, 5, 16, (3, 3), 1, 1, 1, 1),
    (1, 24, 16, 6, 16, (3, 3), 1, 2, 2, 2),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
def test_float_kernels_equal_the_float64_reference(isa, dtype, layout, monkeypatch):
    """Channels-last inputs give channels-last outputs and input gradients (whole-vector stores in the kernel)."""
    torch.manual_seed(0)
    tol = {"rtol": 1e-11, "atol": 1e-11} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-4}
    for n, cin, cout, h, wd, k, s, p, d, g in FLOAT_CASES:
        x = torch.randn(n, cin, h, wd, dtype=torch.float64)
        w = torch.randn(cout, cin // g, *k, dtype=torch.float64)
        conf = (s, p, d, g)
        gy = torch.randn_like(F.conv2d(x, w, None, *conf))
        ref = _fwd_bwd(x, w, conf, gy, "reference", monkeypatch)
        xf, gf = x.to(dtype, memory_format=layout), gy.to(dtype, memory_format=layout)
        got = _fwd_bwd(xf, w.to(dtype), conf, gf, "fast", monkeypatch)
        assert got[0].is_contiguous(memory_format=layout) and got[1].is_contiguous(memory_format=layout)
        for name, a, r in zip(("forward", "grad_input", "grad_weight"), got, ref):
            # float32 sums of up to K = 180 terms of magnitude ~1: relative rounding well under 1e-5
            scale = {} if dtype == torch.float64 else {"atol": tol["atol"] * r.abs().max().item()}
            torch.testing.assert_close(
                a.double(), r, **{**tol, **scale}, msg=lambda m: f"{name} {isa} {n, cin, k} {layout}: {m}"
            )


def _assert_same(got, want, dtype, what):
    """Equal within float rounding where the reference is finite, NaN exactly where it is NaN."""
    assert want.isnan().any(), f"{what}: the case puts no NaN in the reference"  # the case tests something
    tol = {"rtol": 1e-11, "atol": 1e-11} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-4}
    if dtype == torch.float32:  # sums of up to K = 180 terms of magnitude ~1: see the float test above
        tol["atol"] *= want[want.isfinite()].abs().max().item()
    torch.testing.assert_close(got.double(), want.double(), **tol, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
def test_nan_gives_the_gradients_of_the_definition(isa, dtype, layout, monkeypatch):
    """HardTanh(NaN) is NaN, and so is NaN - w: a NaN in the input, the weight or the output gradient gives NaN
    in the forward and both gradients exactly where the unfold reference does, and its values elsewhere."""
    torch.manual_seed(3)
    for n, cin, cout, h, wd, k, s, p, d, g in FLOAT_CASES:
        x = torch.randn(n, cin, h, wd, dtype=torch.float64)
        w = torch.randn(cout, cin // g, *k, dtype=torch.float64)
        conf = (s, p, d, g)
        gy = torch.randn_like(F.conv2d(x, w, None, *conf))
        for where, t, at in (
            ("input", x, (0, 1, 2, 2)),
            ("weight", w, (1, 0, k[0] - 1, 0)),
            ("grad", gy, (0, 1, gy.shape[2] // 2, gy.shape[3] // 2)),  # an output that reads the image
        ):
            t = t.clone()
            t[at] = float("nan")
            xn, wn, gn = (t if where == "input" else x), (t if where == "weight" else w), (t if where == "grad" else gy)
            ref = _fwd_bwd(xn, wn, conf, gn, "reference", monkeypatch)
            xf, gf = xn.to(dtype, memory_format=layout), gn.to(dtype, memory_format=layout)
            got = _fwd_bwd(xf, wn.to(dtype), conf, gf, "fast", monkeypatch)
            for name, a, r in zip(("forward", "grad_input", "grad_weight"), got, ref):
                if where != "grad" or name != "forward":
                    _assert_same(a, r, dtype, f"NaN {where} {at}, {name}, {isa} {n, cin, k}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_infinities_give_the_forward_of_the_definition(isa, dtype, monkeypatch):
    """-sum |x - w| with an infinite input or weight is -inf, and NaN where infinities of one sign meet (inf - inf).
    The forward sums min(x, w) and subtracts the patch's and the weights' sums, where an infinity would cancel into
    NaN: a tile whose sums are not finite takes the direct form. Against the unfold reference, per element."""
    torch.manual_seed(6)
    for n, cin, cout, h, wd, k, s, p, d, g in FLOAT_CASES:
        conf = (s, p, d, g)
        for where, at, value in (
            ("input", (0, 1, 2, 2), float("-inf")),
            ("input", (0, 0, 2, 2), float("inf")),
            ("weight", (1, 0, k[0] - 1, 0), float("-inf")),
            ("weight", (0, 0, 0, 0), float("inf")),
        ):
            x = torch.randn(n, cin, h, wd, dtype=torch.float64)
            w = torch.randn(cout, cin // g, *k, dtype=torch.float64)
            (x if where == "input" else w)[at] = value
            monkeypatch.setenv("ADDERNET_BACKEND", "reference")
            want = adder2d(x, w, None, *conf)
            assert want.isinf().any(), f"{where} {at}: the case puts no infinity in the reference"
            monkeypatch.setenv("ADDERNET_BACKEND", "fast")
            got = adder2d(x.to(dtype), w.to(dtype), None, *conf).double()
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (where, at, isa)
            finite = want.isfinite()
            torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-4 * want[finite].abs().max())


def _with_nan(t, at):
    t = t.clone()
    if at is not None:
        t[at] = float("nan")
    return t


def _fast_against(fn, a, b, backend, names, what, monkeypatch):
    """fn(a, b) and its gradients (output gradient 1) on the fast backend against ``backend``."""
    outs = {}
    for name in (backend, "fast"):
        monkeypatch.setenv("ADDERNET_BACKEND", name)
        ab, bb = a.clone().requires_grad_(), b.clone().requires_grad_()
        y = fn(ab, bb)
        y.backward(torch.ones_like(y))
        outs[name] = (y.detach(), ab.grad, bb.grad)
    for name, got, want in zip(names, outs["fast"], outs[backend]):
        _assert_same(got, want, torch.float32, f"{what}, {name}")


@pytest.mark.parametrize("features", [37, 32])  # 32: a multiple of every vector width, read and written in place
def test_nan_in_adder_linear_and_l1_scores_gives_the_gradients_of_the_definition(isa, features, monkeypatch):
    """AdderLinear against the unfold reference and the L1 scores (dq, dk, both key gradients) against the eager
    kernel, with a NaN in an input row, a weight, a query and a key."""
    torch.manual_seed(4)
    x, w = torch.randn(2, 3, features), torch.randn(5, features)
    for at_x, at_w in (((0, 1, 5), None), (None, (2, 5))):
        what = f"AdderLinear NaN at x {at_x} w {at_w}, {isa}"
        xn, wn = _with_nan(x, at_x), _with_nan(w, at_w)
        _fast_against(adder_linear, xn, wn, "reference", ("forward", "dx", "dw"), what, monkeypatch)
    q, k = torch.randn(3, 5, features), torch.randn(3, 6, features)
    for key_grad in ("hardtanh", "full"):
        for at_q, at_k in (((1, 2, 0), None), (None, (2, 3, 1))):
            what = f"l1_scores {key_grad} NaN at q {at_q} k {at_k}, {isa}"
            scores = functools.partial(l1_scores, key_grad=key_grad)
            qn, kn = _with_nan(q, at_q), _with_nan(k, at_k)
            _fast_against(scores, qn, kn, "eager", ("scores", "dq", "dk"), what, monkeypatch)


def _kernel_sources_copy(dst):
    """A copy of the C kernels' sources at dst, for ADDERNET_KERNEL_SOURCES."""
    import shutil

    shutil.copytree(REPO / "addernet" / "ops" / "kernels", dst, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dst


def test_both_forms_of_the_subtraction_give_the_same_bits(isa, tmp_path, monkeypatch):
    """x - w is issued as fma(x, 1, -w) on AMD CPUs and as a plain add of -w on others (adder_cpu.c, "Port
    balance"; build.py defines ADDERNET_SUB_ON_FMA): both round once, so the two builds agree bit for bit in the
    forward and both gradients, NaN and infinity included (and without them: tiles with a non-finite input or weight
    take other paths)."""
    if PATHS[isa] not in ("avx512", "avx2"):
        pytest.skip(f"the {isa} path has no FMA instruction: one form only")
    monkeypatch.setenv("ADDERNET_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(5)
    got, built = {}, {}
    for form in (0, 1):
        src = _kernel_sources_copy(tmp_path / f"form{form}")
        text = (src / "adder_cpu.c").read_text()
        (src / "adder_cpu.c").write_text(f"#undef ADDERNET_SUB_ON_FMA\n#define ADDERNET_SUB_ON_FMA {form}\n" + text)
        monkeypatch.setenv("ADDERNET_KERNEL_SOURCES", str(src))
        built[form] = build.build_library("adder_cpu", isa).read_bytes()
        got[form] = []
        for n, cin, cout, h, wd, k, s, p, d, g in FLOAT_CASES:
            torch.manual_seed(n * cin + cout)
            x, w = torch.randn(n, cin, h, wd), torch.randn(cout, cin // g, *k)
            conf = ((s, s), (p, p), (d, d), g)
            for nonfinite in (False, True):
                if nonfinite:
                    x[0, 0, 0, 0], x[-1, -1, -1, -1], w[0, 0, 0, 0] = float("nan"), float("inf"), float("-inf")
                y = cpu.forward(x, w, *conf)
                gy = torch.randn_like(y)
                got[form] += [y, cpu.grad_input(x, w, gy, *conf), *cpu.grad_input_weight(x, w, gy, *conf)]
    assert built[0] != built[1], "ADDERNET_SUB_ON_FMA did not change the compiled code"
    for i, (a, b) in enumerate(zip(got[0], got[1])):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"result {i}, {isa}: {m}")


# (N, C, H, W, O, kernel, stride, padding, dilation, groups): K = 144 and 576 (64-byte steps with and
# without the 32-byte tail), K = 3 (a single short row), groups, a filter count that is not a multiple
# of the tile, batch 1 (pixels split across threads)
INT_CASES = [
    (2, 16, 9, 7, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 64, 6, 6, 8, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (3, 3, 5, 6, 7, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (2, 12, 7, 7, 12, (3, 3), (1, 1), (1, 1), (1, 1), 3),
]


@pytest.mark.parametrize("lane", [torch.uint8, torch.uint16], ids=str)
def test_integer_kernel_equals_the_integer_reference(isa, lane):
    g = torch.Generator().manual_seed(1)
    top = 256 if lane == torch.uint8 else 65536
    for n, c, h, wd, o, k, s, p, d, groups in INT_CASES:
        x = torch.randint(0, top, (n, c, h, wd), generator=g, dtype=torch.int32)
        w = torch.randint(0, top, (o, c // groups, *k), generator=g, dtype=torch.int32)
        y = int_cpu.forward(x.to(lane), w.to(lane), s, p, d, groups)
        assert torch.equal(y.long(), int_reference(x, w, s, p, d, groups)), (isa, lane, n, c, k)


@pytest.mark.parametrize("bits", [8, 12])
def test_integer_network_equals_the_float64_reference_on_every_split(isa, bits, monkeypatch):
    """Within float32 rounding of the float64 reference, and bit-identical to the plain-C path, for the
    images split across threads, one image's pixels split across threads, and one thread."""
    quantised = quantised_resnet20(bits)
    x = random_images(3, 2)
    net = IntegerResNet(quantised)  # packed for this path's row alignment and tile
    # 8-bit lanes read planes in place: every layer with the filters across the lanes (2) on AVX2, and on AVX-512
    # on an AMD CPU; on an Intel one all but the 32-channel 3x3 layers by kernel rows (1; those gather: 0); the
    # other paths always gather
    lanes = {2} if isa == "avx2" or build.amd_cpu() else {0, 1}
    expected = {"avx2": lanes, "avx512": lanes}.get(PATHS[isa], {0}) if bits == 8 else {0}
    assert {layer.direct for layer, *_ in net._steps} == expected
    whole = net.features(x)
    single = torch.cat([net.features(x[i : i + 1]) for i in range(3)])
    torch.set_num_threads(1)
    serial = net.features(x)
    assert torch.equal(whole, single) and torch.equal(whole, serial)
    assert max_rel_error(net(x), quantised_reference(quantised, x)) < 3e-5
    monkeypatch.setattr(int_cpu, "amd_cpu", lambda: False)  # AVX-512 on an Intel CPU: kernel rows
    rows = IntegerResNet(quantised)
    assert {layer.direct for layer, *_ in rows._steps} == ({0, 1} if PATHS[isa] == "avx512" and bits == 8 else expected)
    assert torch.equal(whole, rows.features(x))
    monkeypatch.setattr(int_cpu, "direct_row", lambda *shape: 0)  # every layer gathered on this path too
    monkeypatch.setattr(int_cpu, "lanes", lambda *shape: False)
    assert torch.equal(whole, IntegerResNet(quantised).features(x))
    monkeypatch.setenv("ADDERNET_CPU_ISA", "scalar")
    assert torch.equal(whole, IntegerResNet(quantised).features(x))


def test_the_integer_network_on_the_other_pixel_tile(isa, tmp_path, monkeypatch):
    """The integer network's tiles hold 4 pixels with AVX-512 and 2 with AVX2 (adder_int.c PT). Built with the other
    count (ADDERNET_INT_PT), the same path gives the same bits: an AVX2 host runs AVX-512's tile shapes, the filters
    across the lanes included, and an AVX-512 host AVX2's."""
    if PATHS[isa] not in ("avx512", "avx2"):
        pytest.skip(f"the {isa} path has no tile with the filters across the lanes")
    quantised = quantised_resnet20(8)
    x = random_images(3, 2)
    net = IntegerResNet(quantised)
    whole, pt = net.features(x), int_cpu.pixel_tile()
    other = {2: 4, 4: 2}[pt]
    src = _kernel_sources_copy(tmp_path / "kernels")
    text = (src / "adder_int.c").read_text()
    (src / "adder_int.c").write_text(f"#define ADDERNET_INT_PT {other}\n" + text)
    monkeypatch.setenv("ADDERNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADDERNET_KERNEL_SOURCES", str(src))
    assert int_cpu.pixel_tile() == other
    for amd in (True, False):  # on AVX-512: the lanes and the kernel rows
        monkeypatch.setattr(int_cpu, "amd_cpu", lambda amd=amd: amd)
        net = IntegerResNet(quantised)
        assert 2 in {layer.direct for layer, *_ in net._steps} or (PATHS[isa] == "avx512" and not amd)
        assert torch.equal(whole, net.features(x)), (isa, other, amd)
        assert torch.equal(whole[1:2], net.features(x[1:2]))  # one image: its pixels split across the threads


def test_unknown_isa_is_a_config_error(monkeypatch):
    monkeypatch.setenv("ADDERNET_CPU_ISA", "avx1024")
    with pytest.raises(ConfigError, match="ADDERNET_CPU_ISA='avx1024' is not one of native, avx512"):
        build.load_library()


def test_a_path_this_cpu_lacks_is_refused_with_the_missing_flag(monkeypatch):
    """Loading it would die on an illegal instruction; the error names the flag and the way out."""
    monkeypatch.setattr(build, "_cpu_fingerprint", lambda: "flags\t\t: fpu sse sse2 avx avx2 fma")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert build.missing_cpu_flags("avx512") == ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]
    assert build.missing_cpu_flags("sse2") == [] and build.missing_cpu_flags("native") == []
    with pytest.raises(
        BuildError, match="avx512 kernel needs CPU flag avx512f, avx512bw.*lacks; unset ADDERNET_CPU_ISA"
    ):
        build.load_library("adder_int", "avx512")


def test_the_loader_checks_each_struct_against_the_c_code(monkeypatch):
    """Both libraries take the layer geometry as one struct; a ctypes mirror whose layout differs from the C code's
    (geometry.h, adder_int.c's intnet_op) is refused at load time instead of passing misread shapes to a kernel."""
    for lib, functions, structs in (("adder_cpu", cpu.FUNCTIONS, ()), ("adder_int", int_cpu.FUNCTIONS, ())):
        monkeypatch.setattr(build, "_declared", {})
        assert build.library(lib, functions, structs).adder_geometry_size() == ctypes.sizeof(build.Geometry)
    short = type("Short", (ctypes.Structure,), {"_fields_": build.Geometry._fields_[:-1]})
    for lib, functions, size in (
        ("adder_cpu", cpu.FUNCTIONS, "adder_geometry_size"),
        ("adder_int", int_cpu.FUNCTIONS, "adder_intnet_op_size"),
    ):
        monkeypatch.setattr(build, "_declared", {})
        with pytest.raises(BuildError, match=f"{lib}: the C code and Short disagree on its layout \\({size}\\)"):
            build.library(lib, functions, ((size, short),))


def test_the_kernels_build_from_another_checkouts_sources(tmp_path, monkeypatch):
    """ADDERNET_KERNEL_SOURCES: a benchmark loads another version's C kernels into this process. The library is built
    from that folder (a function only its copy has is there) and computes the adder layer; a folder without the
    sources is a ConfigError naming them."""
    import shutil

    other = _kernel_sources_copy(tmp_path / "kernels")
    with open(other / "adder_cpu.c", "a") as f:
        f.write("\nint adder_other_version(void) { return 7; }\n")
    monkeypatch.setenv("ADDERNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADDERNET_KERNEL_SOURCES", str(other))
    assert cpu._lib().adder_other_version() == 7
    x, w = torch.randn(2, 5, 6, 6, dtype=torch.float64), torch.randn(4, 5, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(cpu.forward(x, w, (1, 1), (1, 1), (1, 1), 1), adder2d_reference(x, w, padding=(1, 1)))
    monkeypatch.delenv("ADDERNET_KERNEL_SOURCES")
    assert not hasattr(cpu._lib(), "adder_other_version")
    incomplete = shutil.copytree(other, tmp_path / "incomplete")
    (incomplete / "geometry.h").unlink()
    monkeypatch.setenv("ADDERNET_KERNEL_SOURCES", str(incomplete))
    with pytest.raises(ConfigError, match=r"ADDERNET_KERNEL_SOURCES=.* lacks geometry.h: point it at a checkout's"):
        cpu._lib()


# An AVX2 host's arithmetic on a host with more: ATen's vectorised kernels, oneDNN (convolutions, batch norm), MKL
# (matrix products) and our kernels limited to AVX2. docs/testing.md runs the whole suite so.
AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ADDERNET_CPU_ISA": "avx2",
}
# what torch, oneDNN and our kernels report in a child with AVX2_ENV (a convolution large enough for oneDNN makes
# it say its ISA)
PROBE = (
    "import torch; from addernet.ops.kernels import cpu; "
    "torch.nn.functional.conv2d(torch.ones(8, 16, 32, 32), torch.ones(16, 16, 3, 3)); "
    "print('capability', torch.backends.cpu.get_cpu_capability(), 'kernels', cpu.path())"
)


@pytest.mark.integration
@pytest.mark.slow  # two pytest processes
def test_pinned_numbers_and_formulas_hold_with_an_avx2_hosts_arithmetic():
    """The tests of pinned numbers and of a float32 formula against float64 pass when this host computes as an
    AVX2 host does (other reduction widths and orders, so other roundings): a check of their tolerances on a host
    of the other kind, without one."""
    if platform.machine() not in ("x86_64", "AMD64") or build.missing_cpu_flags("avx2"):
        pytest.skip("this CPU lacks avx2: it cannot compute as an AVX2 host")
    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        pytest.skip("torch already computes with AVX2 here: this run is the AVX2 host's")
    env = child_env(**AVX2_ENV)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "ONEDNN_VERBOSE": "1"},
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "capability AVX2 kernels avx2" in probe.stdout, probe.stdout[-2000:]
    isa = [line for line in probe.stdout.splitlines() if ",isa:" in line]
    assert isa and "AVX-512" not in isa[0] and "AVX2" in isa[0], isa  # oneDNN honours its limit
    tests = [
        "tests/test_engine.py::test_deterministic_run_reproduces_the_pinned_numbers",
        "tests/test_kd.py::test_loss_equals_the_formula_computed_independently",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
