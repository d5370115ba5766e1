"""trainer.ema_decay: an exponential moving average of the model (weights and BatchNorm buffers).

torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn and use_buffers=True: after every optimizer
step, e = decay * e + (1 - decay) * w for every parameter and buffer (the first step copies w). The average
is validated every epoch (``ema_val_*``), saved in last.pt / best.pt as ``ema`` (AveragedModel's state_dict,
the step count ``n_averaged`` included), restored on resume, and evaluated by ``test.py ema=true``.
"""

from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..errors import CheckpointError


class WeightEMA:
    """The moving average of ``model``; ``update()`` after each optimizer step, ``module`` to evaluate."""

    def __init__(self, model, decay):
        self.model, self.decay = model, float(decay)
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True)

    @property
    def module(self):
        return self.averaged.module

    def update(self):
        self.averaged.update_parameters(self.model)

    def state_dict(self):
        return self.averaged.state_dict()

    def load_state_dict(self, state):
        self.averaged.load_state_dict(state)


def ema_weights(ckpt, path):
    """The averaged model's state_dict stored in a training checkpoint (CheckpointError when it has none)."""
    state = ckpt.get("ema") if isinstance(ckpt, dict) else None
    if not state:
        raise CheckpointError(
            f"{path} holds no weight average (it was trained with trainer.ema_decay=null); "
            f"evaluate its own weights with ema=false."
        )
    return {k[len("module.") :]: v for k, v in state.items() if k.startswith("module.")}
