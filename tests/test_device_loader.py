"""data.on_device=true (addernet/data/device_loader.py): torchvision's crop/flip distributions, exactness against a
per-image reference of the same draws, resume by slicing, exact sharding, and train.py end to end."""

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image
from torch.utils.data import DistributedSampler, Subset, TensorDataset

from addernet.data import DataError, DeviceLoader, build_dataset, build_loader, epoch_seed, iter_from, seed_epoch
from addernet.engine import train
from addernet.engine.evaluation import evaluate_checkpoint

from helpers import (
    assert_exact_resume,
    compose,
    folder_run,
    metrics_without_timing,
    trust_cifar10_md5,
    write_cifar10,
    write_jpeg_folder,
    write_mnist,
)

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
# Upper 0.1% points of the chi-square distribution (scipy.stats.chi2.ppf(0.999, df)), df = 81 cells - 1.
CHI2_999_DF80 = 124.839


def _cfg(*overrides):
    return compose(list(overrides)).data


def _coordinate_image():
    """3 x 32 x 32 uint8: channel 0 holds row + 1, channel 1 column + 1 (0 is left for the zero padding)."""
    steps = torch.arange(1, 33, dtype=torch.uint8)
    return torch.stack(
        [
            steps.view(32, 1).expand(32, 32),
            steps.view(1, 32).expand(32, 32),
            torch.full((32, 32), 100, dtype=torch.uint8),
        ]
    )


def _offsets_and_flips(batch):
    """(top, left) in padded coordinates and flips, read back from crops of _coordinate_image (scaled to [0, 1]).

    The centre pixel of a 32 crop from the 40 x 40 padded image always lies inside the image.
    """
    v = (batch * 255).round().long()
    row, col, right = v[:, 0, 16, 16] - 1, v[:, 1, 16, 16] - 1, v[:, 1, 16, 17] - 1
    flips = right < col
    return row + 4 - 16, col + 4 - torch.where(flips, 15, 16), flips


def _cell_counts(top, left):
    assert int(top.min()) >= 0 and int(top.max()) <= 8 and int(left.min()) >= 0 and int(left.max()) <= 8
    return torch.bincount(top * 9 + left, minlength=81).double()


def test_crops_and_flips_have_torchvision_distribution():
    n = 8100  # 100 per crop offset
    images = _coordinate_image().expand(n, 3, 32, 32).contiguous()
    loader = DeviceLoader(
        TensorDataset(torch.arange(n)),
        images,
        torch.arange(n),
        batch_size=1024,
        train=True,
        transform="cifar",
        image_size=32,
        mean=(0, 0, 0),
        std=(1, 1, 1),
        seed=11,
    )
    seed_epoch(loader, 11, 0)
    ours = _offsets_and_flips(torch.cat([x for x, _ in loader]))

    torch.manual_seed(11)
    pil = Image.fromarray(_coordinate_image().permute(1, 2, 0).numpy())
    tv = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    theirs = _offsets_and_flips(torch.stack([tv(pil) for _ in range(n)]))

    expected = n / 81
    for top, left, flips in (ours, theirs):
        counts = _cell_counts(top, left)
        assert ((counts - expected) ** 2 / expected).sum() < CHI2_999_DF80  # uniform over the 9 x 9 offsets
        assert abs(int(flips.sum()) - n / 2) < 4 * (n * 0.25) ** 0.5  # binomial(n, 1/2): within 4 sd
        # flipping is independent of the offset: the flipped half is uniform over the offsets too
        half = _cell_counts(top[flips], left[flips])
        assert ((half - flips.sum() / 81) ** 2 / (flips.sum() / 81)).sum() < CHI2_999_DF80
    a, b = _cell_counts(*ours[:2]), _cell_counts(*theirs[:2])
    assert ((a - b) ** 2 / (a + b)).sum() < CHI2_999_DF80  # two-sample chi-square: same distribution


def _reference_epoch(images, labels, *, seed, epoch, rank, world, batch, size, mean, std):
    """The same draws as DeviceLoader, applied one image at a time with F.pad, slicing, ToTensor and Normalize."""
    sampler = DistributedSampler(range(len(images)), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    if len(order) % batch == 1:
        order = order[:-1]
    g = torch.Generator().manual_seed(epoch_seed(seed, epoch, rank))
    top = torch.randint(0, 40 - size + 1, (len(order),), generator=g)
    left = torch.randint(0, 40 - size + 1, (len(order),), generator=g)
    flip = torch.rand(len(order), generator=g) < 0.5
    out = []
    for k, i in enumerate(order):
        img = F.pad(torch.from_numpy(images[i]).permute(2, 0, 1), (4, 4, 4, 4))
        img = img[:, top[k] : top[k] + size, left[k] : left[k] + size]
        if flip[k]:
            img = img.flip(-1)
        out.append(TF.normalize(TF.to_tensor(img.permute(1, 2, 0).numpy()), mean, std))
    return torch.stack(out), torch.tensor([labels[i] for i in order])


@pytest.mark.parametrize("world, size", [(1, 32), (2, 32), (1, 28)])
def test_train_batches_equal_a_per_image_reference(tmp_path, monkeypatch, world, size):
    written = write_cifar10(tmp_path, n_train=33, n_test=5)  # 33 = 4 x 8 + 1: the lone last sample is dropped
    trust_cifar10_md5(monkeypatch, written["md5"])
    cfg = _cfg(
        f"data.root={tmp_path}",
        "data.download=false",
        "data.batch_size=8",
        "data.on_device=true",
        f"data.image_size={size}",
    )
    images, labels = written["train"]
    for rank in range(world):
        loader = build_loader(cfg, "train", rank=rank, world_size=world, seed=5)
        seed_epoch(loader, 5, 2, rank)
        batches = list(loader)
        assert len(batches) == len(loader) == 4  # 33 // 8, or 17 // 4 per rank
        assert all(x.dtype == torch.float32 and x.shape[1:] == (3, size, size) for x, _ in batches)
        want_x, want_y = _reference_epoch(
            images,
            labels,
            seed=5,
            epoch=2,
            rank=rank,
            world=world,
            batch=8 // world,
            size=size,
            mean=CIFAR_MEAN,
            std=CIFAR_STD,
        )
        assert torch.equal(torch.cat([y for _, y in batches]), want_y)
        assert torch.equal(torch.cat([x for x, _ in batches]), want_x)


def test_same_shuffle_and_shards_as_the_torchvision_path(jpeg_cifar):
    base = [
        "data=cifar10_folder",
        f"data.root={jpeg_cifar}",
        "data.num_classes=4",
        "data.batch_size=10",
        "data.num_workers=0",
        "data.pin_memory=false",
    ]
    for rank in range(2):
        loaders = [
            build_loader(_cfg(*base, f"data.on_device={on}"), "train", rank=rank, world_size=2, seed=4)
            for on in (False, True)
        ]
        for loader in loaders:
            seed_epoch(loader, 4, 3, rank)
        (tv, dev) = ([y for _, y in loader] for loader in loaders)
        assert len(tv) == len(dev) == len(loaders[0]) == len(loaders[1])
        assert all(torch.equal(a, b) for a, b in zip(tv, dev))
        # validation: no augmentation, so the very same tensors (PIL decode once vs per image), incl. a centre crop
        for size in (32, 28):
            vals = [
                list(
                    build_loader(
                        _cfg(*base, f"data.on_device={on}", f"data.image_size={size}"), "val", rank=rank, world_size=2
                    )
                )
                for on in (False, True)
            ]
            assert len(vals[0]) == len(vals[1])
            assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*vals))


@pytest.mark.parametrize("world, batch", [(2, 4), (3, 6)])
def test_val_shards_cover_every_sample_exactly_once(world, batch):
    n = 37
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 32, 32).contiguous()
    seen = []
    for rank in range(world):
        loader = DeviceLoader(
            TensorDataset(torch.arange(n)),
            images,
            torch.arange(n),
            batch_size=batch // world,
            train=False,
            transform="cifar",
            image_size=32,
            mean=(0,),
            std=(1,),
            rank=rank,
            world_size=world,
        )
        assert len(loader.dataset.dataset) == n
        for x, y in loader:
            assert torch.equal((x[:, 0, 5, 7] * 255).round().long(), y)  # each image is its own sample
            seen += y.tolist()
    assert sorted(seen) == list(range(n))


def test_fast_forward_equals_the_tail_of_the_epoch(jpeg_cifar):
    cfg = _cfg(
        "data=cifar10_folder",
        f"data.root={jpeg_cifar}",
        "data.num_classes=4",
        "data.batch_size=8",
        "data.on_device=true",
    )
    loader = build_loader(cfg, "train", seed=9)
    seed_epoch(loader, 9, 1)
    full = list(loader)
    for k in (0, 2, 5, len(loader)):
        seed_epoch(loader, 9, 1)
        torch.rand(3)  # the global RNG plays no part
        tail = list(iter_from(loader, k))
        assert len(tail) == len(full) - k
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tail, full[k:]))
    seed_epoch(loader, 9, 2)
    assert not torch.equal(torch.cat([x for x, _ in loader]), torch.cat([x for x, _ in full]))


@pytest.mark.parametrize("split", ["train", "val", "subset"])
def test_mnist_tensor_resident_batches_equal_the_pil_path(tmp_path, split):
    """MNIST (no augmentation): the batches of the tensor-resident path equal torchvision's PIL path bit for bit,
    for a Subset too (the quantisation calibration set is a random Subset of the training split)."""
    write_mnist(tmp_path, n_train=45, n_test=21)
    batches = {}
    for on_device in ("true", "false"):
        cfg = _cfg(
            "data=mnist",
            f"data.root={tmp_path}",
            "data.download=false",
            f"data.on_device={on_device}",
            "data.batch_size=8",
            "data.num_workers=0",
        )
        if split == "subset":
            loader = build_loader(cfg, "val", Subset(build_dataset(cfg, "train"), [44, 3, 17, 3, 0, 29, 8, 11, 40]))
        else:
            loader = build_loader(cfg, split, seed=5)
        if split == "train":
            seed_epoch(loader, 5, 3)
        batches[on_device] = list(loader)
    # 45 = 5 x 8 + 5 training images, 21 = 2 x 8 + 5 test images, 9 = 8 + 1 picked
    assert len(batches["true"]) == len(batches["false"]) == {"train": 6, "val": 3, "subset": 2}[split]
    for (x, y), (x_ref, y_ref) in zip(batches["true"], batches["false"]):
        assert x.dtype == x_ref.dtype and x.shape == x_ref.shape and torch.equal(x, x_ref) and torch.equal(y, y_ref)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data=imagenet", "data.on_device=true"],
            r"data=imagenet .* does not say one \(data.native_size\); use data.on_device=false",
        ),
        (["data.on_device=true", "data.transform=imagenet"], "not 'imagenet'; use data.on_device=false"),
    ],
)
def test_unsupported_datasets_are_refused(overrides, message):
    with pytest.raises(DataError, match=message):
        build_loader(_cfg(*overrides), "val", TensorDataset(torch.arange(4)))


def test_mixed_image_sizes_are_refused(tmp_path):
    write_jpeg_folder(tmp_path / "train", 2, classes=["a"], size=32)
    write_jpeg_folder(tmp_path / "train", 2, classes=["b"], size=24)
    cfg = _cfg("data=cifar10_folder", f"data.root={tmp_path}", "data.num_classes=2", "data.on_device=true")
    with pytest.raises(DataError, match="is 24x24, but this dataset.s images are 32x32"):
        build_loader(cfg, "train")


# ------------------------------------------------------------------------------------------- end to end


def test_training_and_test_py_evaluation_on_device(tmp_path, jpeg_cifar):
    run = tmp_path / "run"
    train(
        compose(folder_run(jpeg_cifar, "data.on_device=true")),
        str(run),
    )
    [record] = metrics_without_timing(run / "metrics.jsonl")
    assert record["val_n"] == 37 and "48 train / 37 val images" in (run / "train.log").read_text()
    args = [f"checkpoint={run / 'checkpoints' / 'last.pt'}", "trainer.progress=false"]
    result = evaluate_checkpoint(compose(args, config_name="test"), args)  # test.py: the stored config's data
    assert result["n"] == 37 and result["top1"] == record["val_top1"]


@pytest.mark.slow
def test_mid_epoch_resume_equals_uninterrupted(tmp_path, jpeg_cifar):
    base = folder_run(
        jpeg_cifar,
        "data.batch_size=8",
        "data.on_device=true",
        "trainer.epochs=2",
        "trainer.deterministic=true",
        "trainer.seed=2",
    )
    assert_exact_resume(base, at="epoch 2/2 step 3/6", root=tmp_path)
