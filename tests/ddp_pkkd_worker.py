"""torchrun worker for tests/test_pkkd.py: PKKD steps (co-trained CNN twin, rho, adaptive LR) under DDP (gloo, CPU).

Run as ``torchrun --nproc_per_node=2 ddp_pkkd_worker.py OUT_DIR``: every rank trains on its slice of each
batch through the task's own distribute() and saves student, teacher and rho/kernel-scale states to
OUT_DIR/rank{r}.pt. The test imports this module to run the single-process reference on the whole batch.
GroupNorm (per sample) instead of BatchNorm, so the batch split cannot change the maths.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf

from addernet import AdaptiveLR, Adder2d
from addernet.tasks import Student
from addernet.tasks.pkkd import PKKDTask

STEPS, BATCH, NUM_CLASSES = 3, 8, 5


class TinyNet(nn.Module):
    """Conv stem, two body layers (adder or conv; the second strided), GroupNorm, linear head."""

    def __init__(self, layer):
        super().__init__()
        body = Adder2d if layer == "adder" else nn.Conv2d
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body1 = body(4, 4, 3, padding=1, bias=False)
        self.body2 = body(4, 6, 3, stride=2, padding=1, bias=False)
        self.norms = nn.ModuleList(nn.GroupNorm(1, c) for c in (4, 6))
        self.fc = nn.Linear(6, NUM_CLASSES)

    def forward(self, x):
        x = F.relu(self.norms[0](self.body1(self.stem(x))))
        x = F.relu(self.norms[1](self.body2(x)))
        return self.fc(x.mean((2, 3)))


def build_task():
    torch.manual_seed(0)
    student, teacher = TinyNet("adder").double(), TinyNet("conv").double()
    cfg = OmegaConf.create(
        {
            "name": "pkkd",
            "label_smoothing": 0.0,
            "teacher": "cotrain",
            "teacher_loss": "dml",
            "kernel": True,
            "layers": "all",
            "temperature": 2.0,
            "kd_weight": 1.0,
            "feature_weight": 5.0,
            "sigma_scale": 1.0,
            "sigma_momentum": 0.5,
            "rho_side": "student",
            "rho_init": "identity",
            "rho_bias": False,
        }
    )
    task = PKKDTask(
        student, cfg, Student({"name": "tiny", "layer": "adder"}, "tiny", NUM_CLASSES, 3, 8), teacher=teacher
    )
    task.rho.double()
    return task


def make_batches():
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(BATCH, 3, 8, 8, generator=g, dtype=torch.float64),
            torch.randint(0, NUM_CLASSES, (BATCH,), generator=g),
        )
        for _ in range(STEPS)
    ]


def train(task, batches):
    """The engine's step: task loss, one backward, SGD over task.param_groups() with AdaptiveLR on the student."""
    opt = torch.optim.SGD(task.param_groups(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    AdaptiveLR(task.model, 0.2).attach(opt)
    task.train()
    for x, y in batches:
        out = task(x, y)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    return {"student": task.model.state_dict(), **task.extra_state_dicts()}


def main(out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per = BATCH // world
    task = build_task()
    task.distribute(lambda m: nn.parallel.DistributedDataParallel(m))
    shards = [(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]) for x, y in make_batches()]
    torch.save(train(task, shards), f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
