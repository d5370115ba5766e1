"""trainer.precise_bn: re-estimate the BatchNorm statistics at the current weights before validation.

pycls's precise BN (Radosavovic et al., "Designing Network Design Spaces", 2020; Wu & Johnson, "Rethinking
'Batch' in BatchNorm", 2021): the running statistics are an exponential average over many steps of a model
that kept changing, so they lag the current weights; the lag is large for adder layers, whose outputs
(~1e4, negative L1 distances) move fast while the weights train. Before each validation the statistics are
reset and re-estimated as the plain average over ``trainer.precise_bn`` training batches at the current
weights (addernet.quant.calibration.recalibrate_bn, the mechanism the quantiser uses), averaged over ranks.
"""

import itertools
import time

import torch
import torch.nn as nn

from .. import distributed as dist
from ..data import iter_from
from ..errors import ConfigError
from ..forward import autocast, to_device
from ..quant.calibration import recalibrate_bn


def has_batchnorm(model):
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def check_precise_bn(batches, model, what="the model"):
    """ConfigError when trainer.precise_bn asks to re-estimate BatchNorm statistics of a model that has no
    BatchNorm layer (a setting that would do nothing is refused)."""
    if batches and not has_batchnorm(model):
        raise ConfigError(
            f"trainer.precise_bn={batches} re-estimates BatchNorm statistics, but {what} has no BatchNorm "
            f"layer, so it would do nothing; use trainer.precise_bn=0 with this model."
        )


def precise_bn(model, loader, batches, device, amp="off", memory_format=torch.contiguous_format, progress=False):
    """Replace ``model``'s BatchNorm running statistics by their average over ``batches`` batches of ``loader``
    (the first of its current epoch, with its augmentation), averaged over ranks; returns the seconds taken."""
    start = time.perf_counter()
    n = min(int(batches), len(loader))
    images = (to_device(x, y, device, memory_format)[0] for x, y in itertools.islice(iter_from(loader), n))
    with autocast(device, amp):
        recalibrate_bn(model, images, total=n, desc="precise BN", progress=progress)
    if dist.is_distributed():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                for stat in (m.running_mean, m.running_var):
                    dist.all_reduce_sum(stat)
                    stat.div_(dist.get_world_size())
    return time.perf_counter() - start
