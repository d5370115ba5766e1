"""Running sums for loss and top-k accuracy that add up exactly across batches and ranks.

Sums (not averages) are kept, on the device, so that a cross-rank all-reduce of the sums followed
by one division gives the exact dataset-level numbers regardless of how samples were split.
"""
import torch

from .. import distributed as dist


def topk_correct(logits, target, ks=(1, 5)):
    """Number of samples whose target is among the top-k logits, for each k (k capped at #classes)."""
    maxk = min(max(ks), logits.shape[1])
    pred = logits.topk(maxk, dim=1).indices  # N x maxk
    hit = pred.eq(target.view(-1, 1))
    return [hit[:, :min(k, maxk)].any(dim=1).sum() for k in ks]


class MetricSums:
    """Sums of loss, top-1 hits, top-5 hits and sample count; ``compute()`` turns them into averages."""

    def __init__(self, device="cpu"):
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)

    def update(self, loss_sum, logits, target):
        """Add one batch: ``loss_sum`` is the batch's summed (not mean) loss."""
        c1, c5 = topk_correct(logits.detach(), target)
        batch = torch.stack([loss_sum.detach().double(), c1.double(), c5.double(),
                             torch.tensor(float(target.shape[0]), dtype=torch.float64, device=target.device)])
        self.sums += batch.to(self.sums.device)

    def all_reduce(self):
        """Sum over ranks in place (exact: the counts are integers held in float64)."""
        dist.all_reduce_sum(self.sums)
        return self

    def state_dict(self):
        return {"sums": self.sums.cpu()}

    def load_state_dict(self, state):
        self.sums.copy_(state["sums"])

    def compute(self):
        """{"loss", "top1", "top5", "n"}: mean loss, accuracies in percent, sample count."""
        loss, c1, c5, n = self.sums.tolist()
        d = max(n, 1.0)
        return {"loss": loss / d, "top1": 100.0 * c1 / d, "top5": 100.0 * c5 / d, "n": int(n)}
