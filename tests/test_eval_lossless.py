"""The paper's CIFAR-10 row on original images: test.py on the official ResNet-20 and the 1,017 lossless test
images of ../shared/cifar10-lossless-head equals the official code's result exactly (../shared/README.md)."""

import json

import pytest

from helpers import OFFICIAL_R20, SHARED, needs_shared, run_train

HEAD = SHARED / "cifar10-lossless-head"

pytestmark = [needs_shared("official/ResNet20-AdderNet.pth", "cifar10-lossless-head/test"), pytest.mark.slow]


def test_official_checkpoint_on_the_original_test_head_gives_933_and_1010_of_1017(tmp_path):
    results = tmp_path / "results.json"
    args = [
        f"checkpoint={OFFICIAL_R20}",
        "model=resnet20",
        "data=cifar10_folder",
        f"data.root={HEAD}",
        "data.num_workers=0",
        "trainer.progress=false",
        f"results_file={results}",
    ]
    r = run_train(args, script=("test.py",), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == json.loads(results.read_text())
    assert (out["n"], out["top1_correct"], out["top5_correct"]) == (1017, 933, 1010)
    # the official code's 933 / 1,010 of 1,017, with their 95% Wilson intervals (scipy 1.17.1's binomtest values)
    assert out["top1"] == pytest.approx(100 * 933 / 1017) and out["top5"] == pytest.approx(100 * 1010 / 1017)
    assert out["top1_ci95"] == pytest.approx([89.88744654910084, 93.27923841104855])
    assert out["top5_ci95"] == pytest.approx([98.58608460542274, 99.66619456422371])
    assert "top-1 91.74% [89.89, 93.28] (933/1017) | top-5 99.31% [98.59, 99.67] (1010/1017)" in r.stdout
