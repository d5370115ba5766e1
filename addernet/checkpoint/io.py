"""Atomic checkpoint writing and safe loading.

A checkpoint is written to a temporary file in the target folder and moved into place with
os.replace, so a crash (SIGKILL, power loss) leaves either the old file or the new one, never a
half-written file under the real name. Loading uses torch.load(weights_only=True): only tensors and
plain Python containers are accepted, so a checkpoint from an untrusted source cannot run code.
"""

import errno
import io
import os
import pickle
import tempfile
import zipfile

import torch

from ..errors import CheckpointError
from ..zoo.fetch import fetch_hint


def save_checkpoint(state, path):
    """Write ``state`` (tensors and plain containers only) to ``path`` atomically.

    The parent folder is created. The file is serialised in memory first and then written, so a
    failed write is the operating system's own error (e.g. "no space left on device"), not torch's
    zip writer's. The data is fsync'ed before the rename so the new name never points at unwritten
    blocks. The file's permissions follow the umask, like any file the user creates.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)):
            raise _write_error(path, e) from None
        raise
    return path


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_error(path, e):
    """CheckpointError for a failed write: the reason (disk full, read-only, ...) and the old file's fate."""
    text = str(e)
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in text:
        reason = "no space left on device"
    elif isinstance(e, OSError):
        reason = e.strerror or text
    else:  # torch's zip writer wraps the OS error: keep its last line, which names it
        reason = text.strip().splitlines()[-1] if text.strip() else type(e).__name__
    old = (
        f"the previous {os.path.basename(path)} is intact (it is only replaced once a write completes)"
        if os.path.isfile(path)
        else "no earlier file of that name existed"
    )
    return CheckpointError(
        f"cannot write checkpoint {path}: {reason}; {old}. Free space or make "
        f"{os.path.dirname(os.path.abspath(path))} writable, then re-run the same command to "
        f"resume."
    )


def load_checkpoint(path, map_location="cpu"):
    """Load a checkpoint with ``weights_only=True``; clear :class:`CheckpointError` on failure.

    Missing file, truncated/corrupt file and files holding arbitrary Python objects each get a
    message saying what was wrong and what to do.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"checkpoint not found: {os.path.abspath(path)} (check the path; a run writes "
            f"<run dir>/checkpoints/last.pt and best.pt{fetch_hint(path)})."
        )
    if not _looks_like_torch_file(path):
        raise CheckpointError(
            f"{path} is not a checkpoint: it is neither a torch.save zip archive nor a legacy "
            f"torch pickle ({os.path.getsize(path)} bytes). Check the path (a run writes "
            f"<run dir>/checkpoints/last.pt and best.pt)."
        )
    _check_expansion(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Weights only" in str(e):
            raise CheckpointError(
                f"refusing to load {path}: it holds Python objects other than tensors and plain containers, "
                f"which torch.load(weights_only=True) rejects because unpickling them can run arbitrary code. "
                f"Re-save it as a plain state_dict, or load it yourself with weights_only=False only if you "
                f"trust its source. Detail: {str(e).splitlines()[0]}"
            ) from None
        raise CheckpointError(f"cannot read checkpoint {path}: it is corrupt or not a torch file ({e}).") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as e:
        raise CheckpointError(
            f"cannot read checkpoint {path} ({os.path.getsize(path)} bytes): it is truncated or corrupt "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}). If it is a run's last.pt, use best.pt "
            f"or an earlier copy; checkpoints written by this repo are atomic, so this usually means the file "
            f"was damaged after writing or copied incompletely."
        ) from None


def _check_expansion(path):
    """CheckpointError for a zip checkpoint whose compressed entries expand far beyond the file (a zip bomb).

    torch.save stores its entries uncompressed, so its files are never smaller than the data they hold;
    a file that would expand to many times its size was made otherwise and is refused before it is read.
    """
    try:
        with zipfile.ZipFile(path) as z:
            expanded = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a readable zip (legacy format or damaged): torch.load reports it
    size = os.path.getsize(path)
    if expanded > 4 * size + (1 << 20):
        raise CheckpointError(
            f"refusing to load {path}: its {size} bytes expand to {expanded} bytes of compressed "
            f"entries; torch.save never compresses, so this file was not written by torch.save "
            f"(a zip bomb, or a re-packed archive). Re-save it with torch.save."
        )


def _looks_like_torch_file(path):
    """True for torch.save's zip format (even truncated: its first bytes) and its legacy pickle format."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head == b"PK\x03\x04" or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _listing(title, items, limit=12):
    shown = [f"    {x}" for x in items[:limit]]
    if len(items) > limit:
        shown.append(f"    ... and {len(items) - limit} more")
    return [f"  {title} ({len(items)}):"] + shown


def load_weights(model, state_dict, source="checkpoint", hint=""):
    """load_state_dict(strict) with a readable error listing missing, unexpected and mis-shaped keys.

    `source` names the file in the message; `hint` says what to try (e.g. which override picks the model).
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state_dict.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or misshaped:
        lines = [
            f"{source} does not fit the model {type(model).__name__} "
            f"({len(state_dict)} tensors in the checkpoint, {len(expected)} in the model):"
        ]
        for title, items in (
            ("missing in the checkpoint", missing),
            ("unexpected in the checkpoint", unexpected),
            ("mis-shaped", misshaped),
        ):
            if items:
                lines += _listing(title, items)
        if hint:
            lines.append(hint)
        raise CheckpointError("\n".join(lines))
    check_finite(state_dict, source)
    model.load_state_dict(state_dict)
    return model


def check_finite(state_dict, source="checkpoint"):
    """CheckpointError naming the tensors of ``state_dict`` that hold NaN or inf (nothing useful comes of them)."""
    bad = [
        k
        for k, v in state_dict.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and not torch.isfinite(v).all()
    ]
    if bad:
        raise CheckpointError(
            f"{source} holds NaN/inf values in {len(bad)} tensor(s): {', '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''}; a model with them gives meaningless results. Use "
            f"an earlier checkpoint of the run (e.g. checkpoints/best.pt); if the run diverged, "
            f"resume that one with a lower optim.lr (trainer.resume_override=true) or "
            f"trainer.amp=off."
        )
