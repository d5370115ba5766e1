"""The optional training features (each off by default): their results against independent references.

Label smoothing is checked against the closed form of the smoothed cross-entropy in float64.
"""
import pytest
import torch

from addernet.engine import model_from_config
from addernet.errors import ConfigError
from addernet.engine.config import check_config
from addernet.tasks import build_task
from helpers import compose

LENET = ["model=lenet5_bn", "data=fake", "data.image_size=28", "data.train_size=16", "data.val_size=8",
         "data.batch_size=8", "trainer.epochs=1", "trainer.progress=false", "trainer.device=cpu",
         "data.num_workers=0", "data.pin_memory=false", "trainer.log_every=1"]


def smoothed_ce(logits, target, eps):
    """(1 - eps) * NLL(y) + eps * mean_k(-log p_k): the label-smoothed cross-entropy, float64."""
    logp = torch.log_softmax(logits.double(), 1)
    return ((1 - eps) * -logp[torch.arange(len(target)), target] - eps * logp.mean(1)).mean()


def _task(*overrides):
    cfg = compose(LENET + list(overrides))
    torch.manual_seed(0)
    task = build_task(model_from_config(cfg), cfg)
    task.setup(torch.device("cpu"), "off", torch.contiguous_format)
    return task.train()


@pytest.mark.parametrize("task_args", [["task=classification"], ["task=pkkd"]])
def test_label_smoothing_is_the_smoothed_cross_entropy_of_the_student(task_args):
    x, y = torch.randn(8, 3, 28, 28, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    plain, smooth = _task(*task_args), _task(*task_args, "task.label_smoothing=0.2")
    out0, out = plain(x, y), smooth(x, y)
    torch.testing.assert_close(out["output"], out0["output"])  # same weights, same batch
    ce = out.get("ce", out["loss"])
    assert ce.item() == pytest.approx(smoothed_ce(out["output"], y, 0.2).item(), rel=1e-6)
    assert out0.get("ce", out0["loss"]).item() == pytest.approx(smoothed_ce(out0["output"], y, 0.0).item(), rel=1e-6)
    if "teacher_ce" in out:  # PKKD's co-trained teacher keeps the plain CE (docs/training.md)
        assert out["teacher_ce"].item() == pytest.approx(out0["teacher_ce"].item(), rel=1e-6)
        assert (out["loss"] - out0["loss"]).item() == pytest.approx((out["ce"] - out0["ce"]).item(), abs=1e-5)


def test_label_smoothing_in_kd_applies_to_the_ce_term_only(tmp_path):
    from test_kd import conv_teacher_file, kd_cfg
    path, _ = conv_teacher_file(tmp_path)
    x, y = torch.randn(8, 3, 28, 28, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    outs = []
    for extra in ([], ["task.label_smoothing=0.1"]):
        cfg = kd_cfg(path, "task.alpha=0.5", *extra)
        torch.manual_seed(0)
        task = build_task(model_from_config(cfg), cfg)
        task.setup(torch.device("cpu"), "off", torch.contiguous_format)
        outs.append(task.train()(x, y))
    plain, smooth = outs
    assert smooth["ce"].item() == pytest.approx(smoothed_ce(smooth["output"], y, 0.1).item(), rel=1e-6)
    assert smooth["kd"].item() == pytest.approx(plain["kd"].item(), rel=1e-6)
    assert smooth["loss"].item() == pytest.approx(0.5 * smooth["ce"].item() + 0.5 * smooth["kd"].item(), rel=1e-6)


@pytest.mark.parametrize("override, message", [
    ("task.label_smoothing=1.0", "task.label_smoothing must be in [0, 1)"),
    ("task.label_smoothing=-0.1", "task.label_smoothing must be a non-negative number"),
])
def test_bad_option_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        check_config(compose(LENET + [override]))
