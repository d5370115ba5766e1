"""AdaptiveLR: alpha_l = eta*sqrt(k)/||G_l|| applied once per optimizer step to the TOTAL gradient.

Gradients are checked against the closed form of Eq. 5 (dY/dW = X - W) computed here with
explicit loops over output positions, not by the implementation under test.
"""

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from addernet import AdaptiveLR, Adder2d

from helpers import TESTS, adaptive_lr_batches, f32_sum_bound, sgd_with_adaptive_lr, small_adder_net, torchrun

ETA = 0.2
WORKER = TESTS / "ddp_adaptive_lr_worker.py"


def closed_form_grad(x, w, g, stride, padding):
    """Eq. 5: dL/dW[o] = sum_{n,y,x} g[n,o,y,x] * (X_patch[n,:,y,x] - W[o]), by looping over (y, x)."""
    k = w.shape[-1]
    xp = F.pad(x, (padding,) * 4)
    grad = torch.zeros_like(w)
    for oy in range(g.shape[2]):
        for ox in range(g.shape[3]):
            patch = xp[:, :, oy * stride : oy * stride + k, ox * stride : ox * stride + k]  # N,C,k,k
            go = g[:, :, oy, ox]  # N,O
            grad += torch.einsum("no,nckl->ockl", go, patch) - go.sum(0)[:, None, None, None] * w
    return grad


def normalised(grad, eta=ETA):
    return eta * math.sqrt(grad.numel()) * grad / grad.norm().clamp_min(1e-12)


def make_input(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_one_use_matches_closed_form_and_runs_before_step():
    torch.manual_seed(0)
    layer = Adder2d(3, 4, 3, stride=2, padding=1).double()
    x, r = make_input(2, 3, 7, 7, seed=1), make_input(2, 4, 4, 4, seed=2)
    w0 = layer.weight.detach().clone()
    expected_g = closed_form_grad(x, w0, r, stride=2, padding=1)

    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    adaptive = AdaptiveLR(layer, ETA).attach(opt)
    (layer(x) * r).sum().backward()
    torch.testing.assert_close(layer.weight.grad, expected_g)  # plain gradient until the step
    opt.step()

    expected = normalised(expected_g)
    torch.testing.assert_close(layer.weight.grad, expected)
    torch.testing.assert_close(layer.weight.detach(), w0 - 0.5 * expected)
    assert layer.weight.grad.norm().item() == pytest.approx(ETA * math.sqrt(w0.numel()))
    assert adaptive.alphas == {"": pytest.approx(ETA * math.sqrt(w0.numel()) / expected_g.norm().item())}


def test_layer_used_twice_normalises_the_summed_gradient():
    torch.manual_seed(0)
    layer = Adder2d(3, 3, 3, padding=1).double()
    model = nn.Sequential(layer, layer)  # the same module registered twice counts once
    x1, x2 = make_input(2, 3, 5, 5, seed=3), make_input(2, 3, 5, 5, seed=4)
    r1, r2 = make_input(2, 3, 5, 5, seed=5), make_input(2, 3, 5, 5, seed=6)
    w = layer.weight.detach().clone()
    g1, g2 = closed_form_grad(x1, w, r1, 1, 1), closed_form_grad(x2, w, r2, 1, 1)

    adaptive = AdaptiveLR(model, ETA)
    assert adaptive.names == ["0"]
    ((layer(x1) * r1).sum() + (layer(x2) * r2).sum()).backward()
    alphas = adaptive.apply()

    total = g1 + g2
    torch.testing.assert_close(layer.weight.grad, normalised(total))
    assert alphas == {"0": pytest.approx(ETA * math.sqrt(total.numel()) / total.norm().item())}
    per_call = normalised(g1) + normalised(g2)  # what normalising inside each backward call gives
    assert (per_call - normalised(total)).norm() > 0.05 * normalised(total).norm()


def _bn_adder_net():
    """Adder + BatchNorm (eval mode, with real running statistics) + linear head, float64."""
    torch.manual_seed(0)
    model = nn.Sequential(
        Adder2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4, momentum=None),
        nn.ReLU(),
        Adder2d(4, 6, 3, stride=2, padding=1),
        nn.BatchNorm2d(6, momentum=None),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 5),
    ).double()
    with torch.no_grad():
        model.train()
        model(make_input(16, 3, 6, 6, seed=7))  # fill running mean/var so ReLU sees both signs
    return model.eval()


def _sgd_step(model, batches, scale):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    adaptive = AdaptiveLR(model, ETA).attach(opt)
    for x, y in batches:
        (F.cross_entropy(model(x), y) * scale).backward()
    opt.step()
    return adaptive.alphas


def test_accumulating_micro_batches_equals_one_big_batch():
    base = _bn_adder_net()
    x, y = make_input(32, 3, 6, 6, seed=8), torch.randint(0, 5, (32,), generator=torch.Generator().manual_seed(9))
    micro = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]

    big, acc = copy.deepcopy(base), copy.deepcopy(base)
    alphas_big = _sgd_step(big, [(x, y)], 1.0)
    alphas_acc = _sgd_step(acc, micro, 0.25)
    assert list(alphas_acc) == ["0", "3"] and alphas_acc == pytest.approx(alphas_big, rel=1e-9)
    assert acc[0].weight.grad.norm().item() == pytest.approx(ETA * math.sqrt(acc[0].weight.numel()))
    for (name, p_big), p_acc in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(p_acc, p_big, rtol=1e-9, atol=1e-12, msg=name)
    assert not torch.allclose(big[0].weight, base[0].weight)

    # Normalising each micro-batch's gradient (the official per-call behaviour) differs.
    per_micro = torch.zeros_like(base[0].weight)
    for xm, ym in micro:
        base.zero_grad()
        (F.cross_entropy(base(xm), ym) * 0.25).backward()
        per_micro += normalised(base[0].weight.grad)
    base.zero_grad()
    F.cross_entropy(base(x), y).backward()
    whole = normalised(base[0].weight.grad)
    assert (per_micro - whole).norm() > 0.05 * whole.norm()


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    proc = torchrun([WORKER, tmp_path], timeout=240)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    single = small_adder_net()
    init = copy.deepcopy(single.state_dict())
    reference = sgd_with_adaptive_lr(single, adaptive_lr_batches())
    assert reference.names == ["shared", "down"]
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert result["names"] == reference.names  # no "module." prefix under DDP
        assert list(result["alphas"]) == reference.names  # the hook ran under DDP
        assert result["alphas"] == pytest.approx(reference.alphas, rel=1e-6)
        for name, value in single.state_dict().items():
            torch.testing.assert_close(result["state"][name], value, rtol=0, atol=1e-6, msg=name)
            if name in ("shared.weight", "down.weight"):
                assert (value - init[name]).abs().max() > 1e-3  # the steps did move the weights

    # Normalising each replica's half before the reduction (the official code under DDP) differs.
    model = small_adder_net()
    x, y = adaptive_lr_batches()[0]
    halves = []
    for sl in (slice(0, 4), slice(4, 8)):
        model.zero_grad()
        F.cross_entropy(model(x[sl]), y[sl]).backward()
        halves.append(normalised(model.shared.weight.grad))
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    whole = normalised(model.shared.weight.grad)
    assert ((halves[0] + halves[1]) / 2 - whole).norm() > 0.05 * whole.norm()


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_gives_the_same_step_and_skips_inf_steps(fused):
    """fused=False: GradScaler unscales, then calls step() (hook) only on finite steps.
    fused=True: step() (hook) always runs on still-scaled grads and unscales/skips inside."""
    base = _bn_adder_net().float()
    x, y = make_input(8, 3, 6, 6, seed=10).float(), torch.arange(8) % 5

    plain = copy.deepcopy(base)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9, fused=fused)
    AdaptiveLR(plain, ETA).attach(opt)
    F.cross_entropy(plain(x), y).backward()
    opt.step()

    scaled = copy.deepcopy(base)
    opt = torch.optim.SGD(scaled.parameters(), lr=0.1, momentum=0.9, fused=fused)
    adaptive = AdaptiveLR(scaled, ETA).attach(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaler.scale(F.cross_entropy(scaled(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    for (name, p), q in zip(plain.named_parameters(), scaled.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)
    assert scaler.get_scale() == 2.0**12
    assert list(adaptive.alphas) == ["0", "3"]
    if not fused:  # the fused step leaves the grads scaled
        k = scaled[0].weight.numel()  # a formula: the float32 norm of k squares, in any order
        assert scaled[0].weight.grad.norm().item() == pytest.approx(ETA * math.sqrt(k), rel=f32_sum_bound(1, k))

    # A step with an inf gradient is skipped: no weight or momentum changes.
    alphas_before = adaptive.alphas
    weights_before = [p.detach().clone() for p in scaled.parameters()]
    momentum_before = [opt.state[p]["momentum_buffer"].clone() for p in scaled.parameters()]
    opt.zero_grad()
    scaler.scale(F.cross_entropy(scaled(x), y)).backward()
    scaled[-1].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**11
    assert all(torch.equal(p, w) for p, w in zip(scaled.parameters(), weights_before))
    assert all(torch.equal(opt.state[p]["momentum_buffer"], m) for p, m in zip(scaled.parameters(), momentum_before))
    if not fused:  # the hook did not even run
        assert adaptive.alphas == alphas_before
        adder_grad = scaled[0].weight.grad
        assert adder_grad.norm().item() != pytest.approx(ETA * math.sqrt(adder_grad.numel()))


def test_zero_gradient_stays_zero():
    layer = Adder2d(2, 3, 3).double()
    (layer(make_input(1, 2, 4, 4, seed=11)) * 0).sum().backward()
    alphas = AdaptiveLR(layer).apply()
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
    assert alphas == {"": 0.0}  # reported as 0, not the clamp's eta*sqrt(k)/1e-12 spike


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_gradients_stay_finite(dtype):
    layer = Adder2d(16, 16, 3).to(dtype)  # k = 2304: alpha for a tiny norm exceeds the float16 range
    adaptive = AdaptiveLR(layer)
    layer.weight.grad = torch.zeros_like(layer.weight)
    adaptive.apply()
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
    layer.weight.grad = torch.full_like(layer.weight, 1e-6)
    adaptive.apply()
    expected = ETA * math.sqrt(layer.weight.numel())
    assert layer.weight.grad.float().norm().item() == pytest.approx(expected, rel=1e-2)


def test_model_without_adder_layers_is_a_no_op():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 2))
    reference = copy.deepcopy(model)
    x = torch.randn(4, 2, 4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    adaptive = AdaptiveLR(model).attach(opt)
    model(x).sum().backward()
    opt.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).sum().backward()
    ref_opt.step()
    assert adaptive.names == [] and adaptive.alphas == {} and adaptive.apply() == {}
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)  # determinism on one machine: the same float32 step computed twice


def test_only_adder_weights_are_touched_and_frozen_ones_skipped():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 1), Adder2d(3, 3, 3, padding=1, bias=True), Adder2d(3, 2, 3))
    model[2].weight.requires_grad_(False)
    model(torch.randn(2, 2, 5, 5)).sum().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    alphas = AdaptiveLR(model).apply()
    assert list(alphas) == ["1"] and model[2].weight.grad is None
    for name, p in model.named_parameters():
        if name != "1.weight" and p.grad is not None:
            assert torch.equal(p.grad, plain[name]), name  # conv weight/bias and adder bias untouched
    torch.testing.assert_close(model[1].weight.grad, normalised(plain["1.weight"]))
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_hook_scales_only_the_optimizers_own_weights_and_detach_removes_it():
    torch.manual_seed(0)
    model = nn.Sequential(Adder2d(2, 3, 3, padding=1), Adder2d(3, 2, 3))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.0)
    adaptive = AdaptiveLR(model).attach(opt)
    model(torch.randn(2, 2, 5, 5)).sum().backward()
    raw1 = model[1].weight.grad.clone()
    opt.step()
    assert list(adaptive.alphas) == ["0"] and torch.equal(model[1].weight.grad, raw1)
    adaptive.detach()
    raw0 = model[0].weight.grad.mul_(3).clone()
    opt.step()
    assert torch.equal(model[0].weight.grad, raw0)


def test_wrapped_model_names_have_no_wrapper_prefix():
    model = nn.Sequential(Adder2d(2, 3, 3))
    assert AdaptiveLR(model).names == ["0"]
    assert AdaptiveLR(nn.DataParallel(model)).names == ["0"]
    assert AdaptiveLR(torch.compile(nn.DataParallel(model))).names == ["0"]  # nothing compiled yet


@pytest.mark.parametrize("eta", [0, -0.2, float("nan"), float("inf"), "0.2", True])
def test_bad_eta_is_a_clear_error(eta):
    with pytest.raises(ValueError, match="eta must be a finite number > 0"):
        AdaptiveLR(nn.Linear(2, 2), eta)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="needs the model"):
        AdaptiveLR([Adder2d(2, 2, 1)])
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        AdaptiveLR(nn.Linear(2, 2)).attach([])
