"""The checkpoint format: what a training checkpoint holds, and how any checkpoint is read.

Our training checkpoints are dicts (format_version 1) holding the bare model's state_dict as
``model``, the optimizer, scheduler and GradScaler states, the loop position (``epoch`` done, ``step``
into the next one: non-zero only for a mid-epoch SIGTERM save), best-so-far, the metrics history,
partial epoch sums, every rank's RNG states, the resolved config as a plain dict and the world
size; ``task`` holds the state of a training task's own modules (e.g. a teacher) when it has any;
``classes`` the class names of the training set, in label order, when the dataset has names
(ImageFolder, CIFAR, MNIST; FakeData has none). Official AdderNet files are bare state_dicts.
Both load with weights_only=True.
"""
from .io import load_checkpoint
from .official import OFFICIAL_CLASSES, is_official
from ..errors import CheckpointError

FORMAT_VERSION = 1
TRAINING_KEYS = ("model", "optimizer", "scheduler", "epoch", "format_version")
OFFICIAL = "state_dict (official AdderNet format)"


def training_checkpoint(*, model, optimizer, scheduler, scaler, epoch, step, best_top1, best_epoch, history,
                        train_sums, rng, config, world_size, task=None, classes=None):
    """The dict saved as last.pt / best.pt (tensors and plain containers only)."""
    ckpt = {"format_version": FORMAT_VERSION, "model": model, "optimizer": optimizer, "scheduler": scheduler,
            "scaler": scaler, "epoch": epoch, "step": step, "best_top1": best_top1, "best_epoch": best_epoch,
            "history": history, "train_sums": train_sums, "rng": rng, "config": config, "world_size": world_size}
    if task:
        ckpt["task"] = task
    if classes is not None:
        ckpt["classes"] = list(classes)
    return ckpt


def check_training_checkpoint(ckpt, path):
    """Raise CheckpointError unless ``ckpt`` is a training checkpoint this code can resume."""
    missing = [k for k in TRAINING_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is not a training checkpoint of this repo (missing {', '.join(missing)}); "
                              f"to start from weights only, use a fresh run dir without trainer.resume.")
    if ckpt["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format_version {ckpt['format_version']}, newer than this code's "
                              f"{FORMAT_VERSION}; update the repository to resume it.")
    return ckpt


def read_checkpoint(path):
    """(state_dict, stored config or None, kind) for our checkpoints and bare (official) state_dicts."""
    state, stored, kind, _ = open_checkpoint(path)
    return state, stored, kind


def open_checkpoint(path, model_name=None):
    """read_checkpoint's triple + the class names the weights were trained on (None when unknown).

    Official files store no names: ``model_name`` picks the dataset they were trained on (ResNet-20: CIFAR-10).
    """
    ckpt = load_checkpoint(path, map_location="cpu")
    if is_official(ckpt):
        return ckpt, None, OFFICIAL, OFFICIAL_CLASSES.get(model_name)
    if isinstance(ckpt, dict) and is_official(ckpt.get("model")):
        stored = ckpt.get("config")
        return (ckpt["model"], stored if isinstance(stored, dict) else None, f"addernet v{ckpt.get('format_version')}",
                ckpt.get("classes"))
    found = ", ".join(map(str, list(ckpt)[:10])) if isinstance(ckpt, dict) else type(ckpt).__name__
    raise CheckpointError(f"{path} is neither a checkpoint of this repo (a dict with 'model' and 'config') nor a "
                          f"bare state_dict such as the official AdderNet files; found: {found}.")
