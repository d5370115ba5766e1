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

from ..errors import CheckpointError
from .io import load_checkpoint
from .official import OFFICIAL_CLASSES, is_official

FORMAT_VERSION = 1
TRAINING_KEYS = ("model", "optimizer", "scheduler", "epoch", "format_version")
OFFICIAL = "state_dict (official AdderNet format)"


def training_checkpoint(
    *,
    model,
    optimizer,
    scheduler,
    scaler,
    epoch,
    step,
    best_top1,
    best_epoch,
    history,
    train_sums,
    rng,
    config,
    world_size,
    task=None,
    classes=None,
):
    """The dict saved as last.pt / best.pt (tensors and plain containers only)."""
    ckpt = {
        "format_version": FORMAT_VERSION,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "scaler": scaler,
        "epoch": epoch,
        "step": step,
        "best_top1": best_top1,
        "best_epoch": best_epoch,
        "history": history,
        "train_sums": train_sums,
        "rng": rng,
        "config": config,
        "world_size": world_size,
    }
    if task:
        ckpt["task"] = task
    if classes is not None:
        ckpt["classes"] = list(classes)
    return ckpt


def _is_int(v, minimum=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


# field -> (test, what it must be): the loop position and bookkeeping a resume trusts
_FIELDS = {
    "epoch": (_is_int, "an integer >= 0"),
    "step": (_is_int, "an integer >= 0"),
    "best_epoch": (_is_int, "an integer >= 0"),
    "best_top1": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "world_size": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "history": (lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "a list of epoch records"),
    "config": (lambda v: isinstance(v, dict), "a dict (the resolved config)"),
    "model": (lambda v: isinstance(v, dict), "a state_dict"),
    "optimizer": (
        lambda v: isinstance(v, dict) and isinstance(v.get("param_groups"), list) and isinstance(v.get("state"), dict),
        "an optimizer state_dict (param_groups, state)",
    ),
    "scheduler": (lambda v: isinstance(v, dict), "a scheduler state_dict"),
    "scaler": (lambda v: isinstance(v, dict), "a GradScaler state_dict"),
    "train_sums": (lambda v: isinstance(v, dict), "a dict of metric sums"),
}


def check_format_version(ckpt, path):
    """CheckpointError unless ``ckpt["format_version"]`` is an integer this code reads (1 .. FORMAT_VERSION)."""
    version = ckpt.get("format_version")
    if not _is_int(version, 1):
        raise CheckpointError(
            f"{path} has format_version {version!r}, which is not a version this repository "
            f"writes (an integer 1 .. {FORMAT_VERSION}); the file was edited or is not ours."
        )
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {version}, newer than this code's "
            f"{FORMAT_VERSION}; update the repository to read it."
        )


def check_training_checkpoint(ckpt, path):
    """Raise CheckpointError unless ``ckpt`` is a training checkpoint this code can resume.

    Every field a resume relies on is checked for its type and its consistency (history length = epoch),
    so a hand-edited or damaged file gives one line, not a KeyError or TypeError deep in the resume.
    """
    missing = [k for k in TRAINING_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path} is not a training checkpoint of this repo (missing {', '.join(missing)}); "
            f"to start from weights only, use a fresh run dir without trainer.resume."
        )
    check_format_version(ckpt, path)
    absent = [k for k in _FIELDS if k not in ckpt]
    wrong = [
        f"{k} must be {what}, found {_short(ckpt[k])}"
        for k, (ok, what) in _FIELDS.items()
        if k in ckpt and not ok(ckpt[k])
    ]
    if not wrong and len(ckpt["history"]) != ckpt["epoch"]:
        wrong.append(f"history holds {len(ckpt['history'])} epoch record(s) but epoch is {ckpt['epoch']}")
    if (
        not wrong
        and ckpt["step"]
        and not (isinstance(ckpt.get("rng"), list) and len(ckpt["rng"]) == ckpt["world_size"])
    ):
        wrong.append("a mid-epoch checkpoint (step > 0) must hold one RNG state per process")
    if absent or wrong:
        problems = ([f"missing {', '.join(absent)}"] if absent else []) + wrong
        raise CheckpointError(
            f"{path} cannot be resumed: {'; '.join(problems)}. It was edited or damaged; resume "
            f"from an intact copy (e.g. checkpoints/best.pt) or start a fresh run dir."
        )
    return ckpt


def _short(value):
    text = repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__} of {len(value)}"
    return text if len(text) <= 40 else text[:37] + "..."


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
        check_format_version(ckpt, path)
        stored = ckpt.get("config")
        return (
            ckpt["model"],
            stored if isinstance(stored, dict) else None,
            f"addernet v{ckpt.get('format_version')}",
            ckpt.get("classes"),
        )
    found = ", ".join(map(str, list(ckpt)[:10])) if isinstance(ckpt, dict) else type(ckpt).__name__
    raise CheckpointError(
        f"{path} is neither a checkpoint of this repo (a dict with 'model' and 'config') nor a "
        f"bare state_dict such as the official AdderNet files; found: {found}."
    )
