"""torchrun worker for tests/test_adaptive_lr.py: SGD steps on a small adder net under DDP (gloo, CPU).

Run as ``torchrun --nproc_per_node=2 ddp_adaptive_lr_worker.py OUT_DIR``: every rank trains on
its slice of each batch with AdaptiveLR attached and saves its weights to OUT_DIR/rank{r}.pt.
The net, the batches and the loop are helpers.py's, which the test runs on the whole batch in one process.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import adaptive_lr_batches, sgd_with_adaptive_lr, small_adder_net


def main(out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = adaptive_lr_batches()
    per = len(batches[0][1]) // world
    shards = [(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]) for x, y in batches]
    ddp = nn.parallel.DistributedDataParallel(small_adder_net())
    adaptive = sgd_with_adaptive_lr(ddp, shards)
    torch.save(
        {"state": ddp.module.state_dict(), "alphas": adaptive.alphas, "names": adaptive.names},
        f"{out_dir}/rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
