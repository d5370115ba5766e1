"""Training-step speed of an AdderNet under each trainer.amp mode (docs/reliability.md, "Mixed precision").

    python scripts/bench_amp.py [--model resnet20] [--batch 32] [--steps 5] [--rounds 5] [--device cpu]

Times forward + backward + SGD step on random CIFAR-sized batches for: amp off, bf16 and fp16 (adder layers
and their BatchNorm in float32, as the library runs them), and "bf16-rounded": bf16 with the adder outputs
rounded to bf16 (what a layer following conv2d's autocast rule would do; it breaks accuracy). The variants
run interleaved (A B C D A B C D ...), several rounds; prints median and spread of steps/s and the load
average before and after.
"""

import argparse
import contextlib
import importlib
import os
import statistics
import time

import torch
import torch.nn.functional as F

from addernet.errors import reported
from addernet.models import build_model
from addernet.tools.bench import describe, load, metadata

adder_module = importlib.import_module("addernet.ops.adder2d")  # the module (the package exports the function)


@contextlib.contextmanager
def rounded_adder_outputs():
    """Adder layers with bf16 inputs and bf16 outputs under autocast (accumulated in float32 inside)."""
    real = adder_module.adder2d

    def rounded(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        with torch.autocast(input.device.type, enabled=False):
            return real(
                input.bfloat16(),
                weight.bfloat16(),
                None if bias is None else bias.bfloat16(),
                stride,
                padding,
                dilation,
                groups,
            )

    adder_module.adder2d = rounded
    try:
        yield
    finally:
        adder_module.adder2d = real


def steps_per_s(model, opt, x, y, amp, steps):
    dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16, "bf16-rounded": torch.bfloat16}[amp]
    scaler = torch.amp.GradScaler(x.device.type, enabled=amp == "fp16")
    ctx = rounded_adder_outputs() if amp == "bf16-rounded" else contextlib.nullcontext()
    with ctx:

        def step():
            with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(x).float().flatten(1), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        step()  # warm-up
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        return steps / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    model = build_model(a.model, "adder", num_classes=10, in_channels=3).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(a.batch, 3, 32, 32, device=device), torch.randint(0, 10, (a.batch,), device=device)
    modes = ("off", "bf16", "fp16", "bf16-rounded")
    print(f"# {describe(metadata())}")
    print(
        f"load average before: {load()} | torch threads "
        f"{torch.get_num_threads()} | {a.model} batch {a.batch} on {device}"
    )
    rates = {m: [] for m in modes}
    for _ in range(a.rounds):
        for m in modes:
            rates[m].append(steps_per_s(model, opt, x, y, m, a.steps))
    print(f"load average after: {load()}")
    base = statistics.median(rates["off"])
    print("| amp | steps/s (median) | min-max | vs off |\n|---|---|---|---|")
    for m in modes:
        med = statistics.median(rates[m])
        print(f"| {m} | {med:.3f} | {min(rates[m]):.3f}-{max(rates[m]):.3f} | {med / base:.2f}x |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with reported("bench_amp.py"):
        main()
