"""Regression against the official implementation: test.py on the official ResNet-20 and the shared sample.

../shared/official/ResNet20-AdderNet.cifar10-test-sample.jsonl holds the official code's logits for each
of the 1,000 JPEGs in ../shared/cifar10-test-sample and its summary (pinned top-1, pycls/detectron2 style).
The full-sample test.py run happens once (module fixture); a 31-image folder serves the converted checkpoint
and torchrun.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from addernet.checkpoint import load_checkpoint
from addernet.checkpoint.official import load_official
from addernet.data import build_dataset
from addernet.models import build_model

from helpers import CIFAR_SAMPLE, OFFICIAL_LOGITS, OFFICIAL_R20, compose, needs_shared, run_train, torchrun

# every test evaluates the whole 1,000-image sample or starts test.py / torchrun
pytestmark = [
    needs_shared(
        "official/ResNet20-AdderNet.pth", "official/ResNet20-AdderNet.cifar10-test-sample.jsonl", "cifar10-test-sample"
    ),
    pytest.mark.slow,
]
SAMPLE_ARGS = [
    "data=cifar10_folder",
    f"data.val_dir={CIFAR_SAMPLE}",
    "data.num_workers=0",
    "data.pin_memory=false",
    "trainer.progress=false",
]


def _reference():
    lines = OFFICIAL_LOGITS.read_text().splitlines()
    return json.loads(lines[0])["summary"], [json.loads(line) for line in lines[1:]]


def run_test_py(args):
    """Run test.py like a user; returns (process, the JSON object on its last stdout line)."""
    r = run_train(args, script=("test.py",), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def official_run(tmp_path_factory):
    """test.py on the official checkpoint over the whole sample, once: (stdout JSON, results_file JSON)."""
    results = tmp_path_factory.mktemp("official") / "results.json"
    _, out = run_test_py([f"checkpoint={OFFICIAL_R20}", "model=resnet20", *SAMPLE_ARGS, f"results_file={results}"])
    return out, json.loads(results.read_text())


def test_pinned_top1_on_the_shared_sample(official_run):
    """The official checkpoint's top-1 (and top-5) on the sample equal the numbers recorded in ../shared."""
    summary, _ = _reference()
    out, written = official_run
    assert out == written  # results_file holds exactly the printed JSON line
    assert set(out) == {
        *("top1", "top5", "loss", "n", "images_per_s", "weights"),
        *("top1_correct", "top1_ci95", "top5_correct", "top5_ci95"),
    }
    assert out["weights"] == "model"
    assert out["top1_correct"] == 795 and out["top5_correct"] == 984  # 79.5% and 98.4% of 1,000
    assert out["n"] == summary["n"] == 1000
    assert out["top1"] == pytest.approx(summary["top1"], abs=1e-9)
    assert out["top5"] == pytest.approx(summary["top5"], abs=1e-9)
    assert out["images_per_s"] > 0


def test_every_prediction_and_logit_matches_the_official_code():
    """Same model/data code as test.py, per image: same top-1 class, logits within 1e-3 of their scale."""
    _, ref = _reference()
    cfg = compose(["model=resnet20", *SAMPLE_ARGS], config_name="test")
    dataset = build_dataset(cfg.data, "val")
    files = [Path(path).relative_to(CIFAR_SAMPLE).as_posix() for path, _ in dataset.samples]
    by_file = {r["file"]: r for r in ref}
    assert sorted(files) == sorted(by_file)
    model = build_model("resnet20")
    load_official(model, load_checkpoint(OFFICIAL_R20), source=str(OFFICIAL_R20))
    model.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=250, shuffle=False)
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in loader])
    labels = torch.tensor([dataset.targets[i] for i in range(len(dataset))])
    want = torch.tensor([by_file[f]["logits"] for f in files])
    assert labels.tolist() == [by_file[f]["label"] for f in files]  # ImageFolder order = CIFAR-10 label order
    assert logits.argmax(1).tolist() == [by_file[f]["pred"] for f in files]
    scale = want.abs().amax(1)
    # every reference prediction wins by more than twice the 1e-3 bound below, so any CPU within it (and the
    # pinned top-1 of test_pinned_top1_on_the_shared_sample) agrees whatever its float32 rounding
    top2 = want.topk(2, 1).values
    assert ((top2[:, 0] - top2[:, 1]) / scale).min().item() > 2e-3
    rel = (logits - want).abs().amax(1) / scale
    backend = os.environ.get("ADDERNET_BACKEND", "fast")
    assert rel.max().item() <= 1e-3, (
        f"ADDERNET_BACKEND={backend}: {(rel > 1e-3).sum().item()} image(s) beyond 1e-3, worst "
        f"{files[rel.argmax()]} at {rel.max().item():.2e} of its largest logit (median {rel.median().item():.1e})"
    )


@pytest.fixture(scope="module")
def small_sample(tmp_path_factory):
    """31 images of the sample (3 per class + 1: an odd count) in their own folder, and the official code's top-1."""
    _, ref = _reference()
    root = tmp_path_factory.mktemp("small_sample")
    picked = [r for r in ref if int(r["file"].split("/")[1][:4]) < 3] + [ref[-1]]
    for r in picked:
        (root / r["file"]).parent.mkdir(exist_ok=True)
        shutil.copy(CIFAR_SAMPLE / r["file"], root / r["file"])
    return root, 100.0 * sum(r["pred"] == r["label"] for r in picked) / len(picked)


def test_converted_checkpoint_gives_identical_results(converted_r20, small_sample):
    """convert_official.py writes our format with a config and the official file's very weights: test.py needs
    no model= and reproduces the official code's predictions."""
    ckpt = torch.load(converted_r20, map_location="cpu", weights_only=True)
    assert ckpt["config"]["model"] == {"name": "resnet20", "layer": "adder"}
    assert ckpt["config"]["data"]["name"] == "cifar10"
    official = build_model("resnet20")
    load_official(official, load_checkpoint(OFFICIAL_R20), source=str(OFFICIAL_R20))
    assert list(ckpt["model"]) == list(official.state_dict())
    assert all(torch.equal(ckpt["model"][k], v) for k, v in official.state_dict().items())
    folder, want_top1 = small_sample
    _, out = run_test_py(
        [f"checkpoint={converted_r20}", "data=cifar10_folder", f"data.val_dir={folder}", *SAMPLE_ARGS[2:]]
    )
    assert out["n"] == 31 and out["top1"] == pytest.approx(want_top1, abs=1e-9)


@pytest.mark.distributed
def test_torchrun_two_processes_counts_every_image_once(small_sample):
    """Under torchrun (2 CPU processes, gloo) an odd-sized folder is split without padding or loss."""
    folder, want_top1 = small_sample
    args = [
        f"checkpoint={OFFICIAL_R20}",
        "model=resnet20",
        "data=cifar10_folder",
        f"data.val_dir={folder}",
        "data.num_workers=0",
        "data.pin_memory=false",
        "data.batch_size=8",
        "trainer.progress=false",
    ]
    r = torchrun(["test.py", *args], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 31
    assert out["top1"] == pytest.approx(want_top1, abs=1e-9)
    assert r.stdout.count('"top1"') == 1  # only rank 0 reports
