"""The integer inference network of a quantised CIFAR ResNet (CPU): activations stay integer between
adder layers, and the whole body runs in one call of the integer kernel (ops/kernels/adder_int.c).

Where the integer region starts (after the stem convolution) the stem's BatchNorm and ReLU and the
quantisation of the first adder layers' input are one pass. Every adder layer then reads unsigned
integers (uint8 up to 8 bits, uint16 above) and its epilogue applies, per output channel,

    v = alpha * sum|q_a - u| + beta      alpha = -(s/(2^b-1)) k,  beta = (-(s/(2^b-1)) c + beta_q - mean) k + b

(k = gamma / sqrt(var + eps): the layer's scale s, the constant c of the unsigned form, the bias term
beta_q of the weight clamp and BatchNorm folded, in float64), then ReLU and the next layers' input
quantisation clamp(round(v (2^b-1) / s'), 0, 2^b-1) for each scale s' they read. A layer whose
groups of filters have different scales reads one plane per scale in the same call.

Residual joins are added in float (ours): the block's input, or its 1x1 downsample's output, is kept
as float32 and added in the second layer's epilogue before the ReLU, exactly where the layer-by-layer
model adds it; so the network computes what the QAdder2d model computes, up to float rounding (a
value within rounding of a rounding boundary can land on the neighbouring level). The float copy
of the last block's output feeds the float average pool, classifier and BatchNorm.

    net = IntegerResNet(quantised_model)       # or addernet.quant.load_quantized(path)
    logits = net(images)                        # CPU, float32 NCHW images
"""

import torch
import torch.nn as nn

from ..models.blocks import BasicBlock
from ..models.resnet_cifar import CifarResNet
from ..ops.conv_args import out_hw
from ..ops.kernels import int_cpu
from .qadder import QAdder2d, nan_where_not_finite
from .quantizer import lane, levels, unsigned_form


def unsupported_reason(model):
    """Why `model` cannot run as an IntegerResNet (a short phrase), or None when it can."""
    if not isinstance(model, CifarResNet):
        return f"{type(model).__name__} is not a CIFAR ResNet (the integer network covers resnet20/resnet32)"
    blocks = [b for stage in (model.layer1, model.layer2, model.layer3) for b in stage]
    for b in blocks:
        if not isinstance(b, BasicBlock):
            return f"block {type(b).__name__} is not a BasicBlock"
        for q in (b.conv1, b.conv2, *((b.downsample[0],) if b.downsample is not None else ())):
            if not isinstance(q, QAdder2d):
                return "its body layers are not quantised adder layers"
            if q.groups != 1 or q.dilation != (1, 1):
                return "a layer has conv groups or dilation"
    bits = {int(q.bits) for q in model.modules() if isinstance(q, QAdder2d)}
    if len(bits) != 1:
        return f"its layers mix bit widths {sorted(bits)}"
    return None


class _Act:
    """An activation of the integer region: a float copy and/or integer planes (one per scale)."""

    def __init__(self, c):
        self.c, self.h, self.w = c, None, None
        self.scales, self.planes, self.float_buf = [], {}, None
        self.needs_float = False

    def want(self, scales):
        self.scales += [s for s in scales if s not in self.scales]


def _bn_affine(bn):
    """(k, shift) in float64 with BatchNorm(y) = k y + shift (eval mode)."""
    k = bn.weight.double() / (bn.running_var.double() + bn.eps).sqrt()
    return k, bn.bias.double() - bn.running_mean.double() * k


class _Layer:
    """Packed weights and the folded epilogue of one QAdder2d followed by BatchNorm `bn`."""

    def __init__(self, q, bn, lane):
        ot, align = int_cpu.filter_tile(), int_cpu.row_align()
        lv = levels(int(q.bits))
        s = q.scale[q.group].double()  # per filter
        self.scales = sorted(set(s.tolist()))
        plane = torch.tensor([self.scales.index(v) for v in s.tolist()])
        qw = q.grid_weights().to(torch.int64)
        u, c = unsigned_form(qw)
        c = c.double()
        k, shift = _bn_affine(bn)
        alpha = -(s / lv) * k
        beta = (-(s / lv) * c + q.bias_term.double() - bn.running_mean.double()) * k + bn.bias.double()
        o, cin, kh, kw = qw.shape
        kk = cin * kh * kw
        lanes = int_cpu.lanes(cin, kh, kw, lane)
        rp = 0 if lanes else int_cpu.direct_row(cin, kh, kw, lane)  # > 0: the tiles read kernel rows in place
        self.direct = 2 if lanes else int(rp > 0)  # adder_int.c intnet_op.direct
        self.kp = kk if lanes else kh * rp if rp else -(-kk // align) * align
        slots, tile_plane = [], []
        for p in range(len(self.scales)):
            members = torch.nonzero(plane == p).flatten().tolist()
            members += [-1] * (-len(members) % ot)
            slots += members
            tile_plane += [p] * (len(members) // ot)
        chan = torch.tensor(slots, dtype=torch.int64)
        real = chan >= 0
        # (i, j, c) order; by kernel rows: each row's kw*cin weights padded to rp, else the whole patch to kp
        rows, run = (kh, kw * cin) if self.direct == 1 else (1, kk)
        wrows = torch.zeros(len(slots), rows, self.kp // rows, dtype=torch.int64)
        wrows[real, :, :run] = u.permute(0, 2, 3, 1).reshape(o, rows, run)[chan[real]]
        if lanes:  # per filter tile: K/8 steps of [ot][8] bytes
            wrows = wrows.view(-1, ot, kk // 8, 8).transpose(1, 2)
        wrows = wrows.reshape(len(slots), self.kp)
        self.w = wrows.to(lane).contiguous()
        self.chan = chan
        self.tile_plane = torch.tensor(tile_plane, dtype=torch.int64)
        firsts = []
        for b in range(len(tile_plane)):
            t = slots[b * ot : (b + 1) * ot]
            firsts.append(t[0] if t[0] >= 0 and t == list(range(t[0], t[0] + ot)) else -1)
        self.tile_first = torch.tensor(firsts, dtype=torch.int64)
        self.alpha = torch.where(real, alpha[chan.clamp(min=0)], 0.0).contiguous()
        self.beta = torch.where(real, beta[chan.clamp(min=0)], 0.0).contiguous()
        self.q, self.lv, self.o = q, lv, o


def _assign(bufs):
    """(byte offset of every buffer, bytes in all) in a per-thread area; buffers whose lives (from the op
    writing them to the last op reading them) do not overlap share space."""
    slots, offsets, end = [], [0, 0], 0  # slot: [offset, bytes, free after op]
    for b in range(2, len(bufs)):
        nbytes, first, lastuse = bufs[b]
        nbytes = -(-nbytes // 64) * 64
        slot = next((s for s in slots if s[2] < first and s[1] >= nbytes), None)
        if slot is None:
            slot = [end, nbytes, lastuse]
            slots.append(slot)
            end += nbytes
        slot[2] = max(lastuse, first)
        offsets.append(slot[0])
    if len(bufs) > int_cpu.MAX_BUFFERS:
        raise ValueError(f"the integer network needs {len(bufs)} buffers; at most {int_cpu.MAX_BUFFERS}")
    return offsets, end


class IntegerResNet(nn.Module):
    """Inference-only integer network of a quantised CifarResNet (eval mode, CPU); see the module docstring.

    It is built from a snapshot of the quantised model's buffers: rebuild it after changing them."""

    def __init__(self, model):
        super().__init__()
        why = unsupported_reason(model)
        if why is not None:
            raise ValueError(f"no integer network for this model: {why}")
        self.conv1, self.avgpool, self.fc, self.bn2 = model.conv1, model.avgpool, model.fc, model.bn2
        bits = next(int(m.bits) for m in model.modules() if isinstance(m, QAdder2d))
        self.bits, self.lane = bits, lane(bits)
        self._build(model)
        super().train(False)

    def train(self, mode=True):
        if mode:
            raise RuntimeError("IntegerResNet is inference only (BatchNorm is folded); train the float model")
        return super().train(False)

    # ---- program ---------------------------------------------------------------------------------------------

    def _build(self, model):
        """The steps (layer, input, output, residual input or None, ReLU) and which copies each activation needs;
        buffers and shapes follow per input size in _program."""
        blocks = [b for stage in (model.layer1, model.layer2, model.layer3) for b in stage]
        steps = []
        x = entry = _Act(model.conv1.out_channels)  # the stem's output after its BatchNorm and ReLU
        for b in blocks:
            if b.downsample is not None:
                ds = _Layer(b.downsample[0], b.downsample[1], self.lane)
                ident = _Act(ds.o)
                steps.append((ds, x, ident, None, False))
            else:
                ident = x
            c1, c2 = _Layer(b.conv1, b.bn1, self.lane), _Layer(b.conv2, b.bn2, self.lane)
            h, y = _Act(c1.o), _Act(c2.o)
            steps += [(c1, x, h, None, True), (c2, h, y, ident, True)]
            ident.needs_float = True
            x = y
        x.needs_float = True  # the last block's output: the float tail
        for layer, src, _, _, _ in steps:
            src.want(layer.scales)
        self._steps, self._entry_act, self._stem_bn = steps, entry, model.bn1
        self._ops_for = {}

    def _program(self, h, w):
        """(ctypes ops, buffer offsets, per-thread bytes, rows offset, output shape) for a stem output h x w."""
        if (h, w) in self._ops_for:
            return self._ops_for[(h, w)]
        steps, lv = self._steps, levels(self.bits)
        border = max(max(layer.q.padding) for layer, *_ in steps)  # every plane's zero border: no bounds checks
        elem = torch.empty((), dtype=self.lane).element_size()
        last = steps[-1][2]
        bufs = [[0, -1, -1], [0, -1, -1]]  # per buffer: [bytes, producing op, last reading op]; 0/1: input, output

        def new_buf(nbytes, at):
            bufs.append([nbytes, at, at])
            return len(bufs) - 1

        def use(buf, at):
            if buf >= 2:
                bufs[buf][2] = max(bufs[buf][2], at)

        def outputs(act, at):
            """Allocate act's float copy and planes, written by op `at`; returns (out_buf, q_bufs, invs)."""
            n = act.c * act.h * act.w
            act.float_buf = (1 if act is last else new_buf(4 * n, at)) if act.needs_float else None
            bordered = act.c * (act.h + 2 * border) * (act.w + 2 * border)
            act.planes = {s: new_buf(elem * bordered, at) for s in act.scales}
            return (
                -1 if act.float_buf is None else act.float_buf,
                [act.planes[s] for s in act.scales],
                [lv / s for s in act.scales],
            )

        entry = self._entry_act
        entry.h, entry.w = h, w
        ops = []
        k, shift = _bn_affine(self._stem_bn)
        alpha, beta = k.contiguous(), shift.contiguous()
        out_buf, q_bufs, invs = outputs(entry, 0)
        ops.append(
            dict(
                kind=int_cpu.OP_ENTRY,
                C=entry.c,
                H=h,
                W=w,
                O=entry.c,
                in_buf=0,
                out_buf=out_buf,
                res_buf=-1,
                relu=1,
                q=q_bufs,
                inv=invs,
                alpha=alpha,
                beta=beta,
            )
        )
        for i, (layer, src, dst, res, relu) in enumerate(steps, start=1):
            q = layer.q
            (kh, kw), (sh, sw), (ph, pw) = q.kernel_size, q.stride, q.padding
            ho, wo = out_hw((0, 0, src.h, src.w), (0, 0, kh, kw), q.stride, q.padding, q.dilation)
            if ho < 1 or wo < 1:
                raise ValueError(f"input too small: a {src.h}x{src.w} activation reaches a {kh}x{kw} adder layer")
            dst.h, dst.w = ho, wo
            planes = [src.planes[s] for s in layer.scales]
            for b in planes:
                use(b, i)
            if res is not None:
                use(res.float_buf, i)
            out_buf, q_bufs, invs = outputs(dst, i)
            ops.append(
                dict(
                    kind=int_cpu.OP_ADDER,
                    C=src.c,
                    H=src.h,
                    W=src.w,
                    O=layer.o,
                    kh=kh,
                    kw=kw,
                    sh=sh,
                    sw=sw,
                    ph=ph,
                    pw=pw,
                    Ho=ho,
                    Wo=wo,
                    Kp=layer.kp,
                    direct=layer.direct,
                    n_tiles=len(layer.tile_plane),
                    n_planes=len(planes),
                    in_buf=planes[0],
                    in_planes=torch.tensor(planes, dtype=torch.int64),
                    out_buf=out_buf,
                    res_buf=-1 if res is None else res.float_buf,
                    relu=int(relu),
                    q=q_bufs,
                    inv=invs,
                    w=layer.w,
                    tile_plane=layer.tile_plane,
                    tile_first=layer.tile_first,
                    chan=layer.chan,
                    alpha=layer.alpha,
                    beta=layer.beta,
                )
            )
        offsets, rows_off = _assign(bufs)
        max_rows = max((o["n_planes"] * o["Kp"] for o in ops if o["kind"] == int_cpu.OP_ADDER), default=0)
        ws_bytes = rows_off + int_cpu.pixel_tile() * max_rows * elem + 64  # a tile's rows per plane
        c_ops = (int_cpu.IntnetOp * len(ops))()
        keep = []
        for co, o in zip(c_ops, ops):
            for name in int_cpu.INT_FIELDS:  # those an op does not use are 0
                setattr(co, name, int(o.get(name, 0)))
            co.in_buf = o["in_buf"]
            co.n_q, co.lv, co.border = len(o["q"]), lv, border
            if co.n_q > int_cpu.MAX_OUTPUTS:
                raise ValueError(
                    f"an activation is read at {co.n_q} scales; the integer network handles at most "
                    f"{int_cpu.MAX_OUTPUTS}"
                )
            for j, (b, inv) in enumerate(zip(o["q"], o["inv"])):
                co.q_buf[j], co.inv[j] = b, inv
            for name in ("w", "in_planes", "tile_plane", "tile_first", "chan", "alpha", "beta"):
                if name in o:
                    keep.append(o[name])
                    setattr(co, name, o[name].data_ptr())
        result = (c_ops, offsets, ws_bytes, rows_off, (last.h, last.w, last.c), keep)
        self._ops_for[(h, w)] = result
        return result

    # ---- forward -----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def features(self, x):
        """The last block's output (N, C, H, W), float32 in channels-last memory: stem, then the integer region."""
        if x.device.type != "cpu":
            raise RuntimeError(f"IntegerResNet runs on CPU; got a tensor on {x.device.type}")
        h = self.conv1(x.float().contiguous(memory_format=torch.channels_last))
        h = h.float().permute(0, 2, 3, 1).contiguous()  # NHWC float32 (also under autocast); no copy usually
        ops, offsets, ws_bytes, rows_off, (ho, wo, co), _ = self._program(h.shape[1], h.shape[2])
        out = torch.empty(h.shape[0], ho, wo, co)
        int_cpu.run_network(ops, self.lane, h, out, offsets, ws_bytes, rows_off)
        return nan_where_not_finite(x, out.permute(0, 3, 1, 2))  # integers cannot hold NaN: the float model's answer

    @torch.no_grad()
    def forward(self, x):
        return self.bn2(self.fc(self.avgpool(self.features(x)))).flatten(1)
