"""torchrun worker for tests/test_adaptive_lr.py: SGD steps on a small adder net under DDP (gloo, CPU).

Run as ``torchrun --nproc_per_node=2 ddp_adaptive_lr_worker.py OUT_DIR``: every rank trains on
its slice of each batch with AdaptiveLR attached and saves its weights to OUT_DIR/rank{r}.pt.
The test imports the same module to run the single-process reference on the whole batch.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from addernet import AdaptiveLR, Adder2d

STEPS, BATCH, NUM_CLASSES = 3, 8, 5


class SmallAdderNet(nn.Module):
    """Conv stem, one adder layer used twice (shared weight), a strided adder layer, linear head.
    GroupNorm (per sample) instead of BatchNorm, so the batch split cannot change the maths."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.shared = Adder2d(4, 4, 3, padding=1)
        self.down = Adder2d(4, 6, 3, stride=2, padding=1)
        self.norms = nn.ModuleList(nn.GroupNorm(1, c) for c in (4, 4, 6))
        self.fc = nn.Linear(6, NUM_CLASSES)

    def forward(self, x):
        x = self.stem(x)
        x = self.norms[0](self.shared(x))
        x = self.norms[1](self.shared(x))
        x = F.relu(self.norms[2](self.down(x)))
        return self.fc(x.mean((2, 3)))


def build_model():
    torch.manual_seed(0)
    return SmallAdderNet().double()


def make_batches():
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(BATCH, 3, 8, 8, generator=g, dtype=torch.float64),
            torch.randint(0, NUM_CLASSES, (BATCH,), generator=g),
        )
        for _ in range(STEPS)
    ]


def train(model, batches, eta=0.2):
    """Plain loop: zero_grad, mean cross-entropy, backward, step (AdaptiveLR hooked into step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    adaptive = AdaptiveLR(model, eta).attach(opt)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return adaptive


def main(out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert BATCH % world == 0, "BATCH must divide by the number of processes"
    per = BATCH // world
    ddp = nn.parallel.DistributedDataParallel(build_model())
    shards = [(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]) for x, y in make_batches()]
    adaptive = train(ddp, shards)
    torch.save(
        {"state": ddp.module.state_dict(), "alphas": adaptive.alphas, "names": adaptive.names},
        f"{out_dir}/rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
