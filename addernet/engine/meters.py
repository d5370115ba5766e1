"""Running sums for loss, top-k accuracy and a task's named loss parts, exact across batches and ranks.

Sums (not averages) are kept, on the device, so that a cross-rank all-reduce of the sums followed
by one division gives the exact dataset-level numbers regardless of how samples were split, and
so that updating them never waits for the device.
"""

import torch

from .. import distributed as dist


def topk_correct(logits, target, ks=(1, 5)):
    """Number of samples whose target is among the top-k logits, for each k (k capped at #classes)."""
    maxk = min(max(ks), logits.shape[1])
    pred = logits.topk(maxk, dim=1).indices  # N x maxk
    hit = pred.eq(target.view(-1, 1))
    return [hit[:, : min(k, maxk)].any(dim=1).sum() for k in ks]


class MetricSums:
    """Sums of loss, top-1 hits, top-5 hits, sample count and named parts; ``compute()`` gives averages.

    A part (e.g. a distillation term) is a per-batch mean; it is summed weighted by the batch size,
    so its epoch value is the per-sample average like the loss.
    """

    def __init__(self, device="cpu"):
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)
        self.parts = {}

    def update(self, loss_sum, logits, target, parts=None):
        """Add one batch: ``loss_sum`` is the batch's summed (not mean) loss, ``parts`` name -> batch mean."""
        c1, c5 = topk_correct(logits.detach(), target)
        n = target.shape[0]
        self.sums[:3] += torch.stack([loss_sum.detach().double(), c1.double(), c5.double()]).to(self.sums.device)
        self.sums[3] += n
        for name, value in (parts or {}).items():
            if name not in self.parts:
                self.parts[name] = torch.zeros((), dtype=torch.float64, device=self.sums.device)
            self.parts[name] += value.detach().double().to(self.sums.device) * n

    def all_reduce(self):
        """Sum over ranks in place (exact for the counts: integers held in float64)."""
        dist.all_reduce_sum(self.sums)
        for name in sorted(self.parts):  # the same order on every rank
            dist.all_reduce_sum(self.parts[name])
        return self

    def state_dict(self):
        return {"sums": self.sums.cpu(), "parts": {k: v.cpu() for k, v in self.parts.items()}}

    def load_state_dict(self, state):
        self.sums.copy_(state["sums"])
        self.parts = {k: v.to(self.sums.device) for k, v in state.get("parts", {}).items()}

    def compute(self):
        """{"loss", "top1", "top5", "n", **parts}: means, accuracies in percent, sample count."""
        loss, c1, c5, n = self.sums.tolist()
        d = max(n, 1.0)
        out = {"loss": loss / d, "top1": 100.0 * c1 / d, "top5": 100.0 * c5 / d, "n": int(n)}
        out.update({k: v.item() / d for k, v in sorted(self.parts.items())})
        return out
