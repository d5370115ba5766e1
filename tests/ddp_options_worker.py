"""torchrun worker for tests/test_training_options.py: trainer.accumulate under DDP (gloo, CPU).

Run as ``torchrun --nproc_per_node=2 ddp_options_worker.py OUT_DIR ACCUMULATE``: every rank makes the
engine's optimizer steps (addernet.engine.step.Stepper) on its half of each batch, counting the gradient
all-reduces with a DDP communication hook, and saves its weights and the count to OUT_DIR/rank{r}.pt.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from omegaconf import OmegaConf

from addernet import AdaptiveLR
from addernet.engine.loop import LossWatch
from addernet.engine.meters import MetricSums
from addernet.engine.step import Stepper
from addernet.tasks import ClassificationTask

from helpers import small_adder_net, small_batches


def main(out_dir, accumulate):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = small_adder_net()
    task = ClassificationTask(model, OmegaConf.create({"name": "classification", "label_smoothing": 0.0}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    adaptive = AdaptiveLR(model, 0.2).attach(opt)
    task.distribute(lambda m: nn.parallel.DistributedDataParallel(m))
    calls = []

    def counting_allreduce(state, bucket):
        calls.append(1)
        tensor = bucket.buffer().div_(world)
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

    task.net.register_comm_hook(None, counting_allreduce)
    stepper = Stepper(task, opt, torch.amp.GradScaler("cpu", enabled=False), adaptive, accumulate)
    task.train()
    sums, watch = MetricSums(), LossWatch("cpu")
    per = 8 // world
    for step, (x, y) in enumerate(small_batches(8), 1):
        stepper(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per], sums, watch, step)
    torch.save({"state": model.state_dict(), "allreduces": len(calls)}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
