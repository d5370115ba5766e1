"""What a resume may change, and which checkpoint a run resumes from: the rules that keep a run's work.

Which checkpoint (``choose_resume``, rank 0 decides):
  1. the run dir's own ``checkpoints/last.pt`` when it exists (it wins over trainer.resume, so a
     re-queued job with the same command continues its own later epochs, and the log says so);
  2. else ``trainer.resume`` when given (a run dir stands for its ``checkpoints/last.pt``);
  3. else a fresh start, but only in a run dir that holds no history: a dir with ``best.pt`` or a
     non-empty ``metrics.jsonl`` but no ``last.pt`` is refused with the choices (resume from best.pt,
     a fresh dir, or delete those files).

Which settings (``config_changes``): the resolved config of the run is compared with the one stored in
the checkpoint, key by key.
  MAY_CHANGE   applied and logged (the run's length, logging, workers, where the data lies, ...);
  NEVER        refused always: the checkpoint's weights or optimizer state belong to the old value;
  any other    refused with the list of differing keys unless ``trainer.resume_override=true``, which
               applies them from the resume point on (logged; config.yaml records them).
A key the checkpoint does not record (an option newer than the checkpoint) is taken as given and logged.
"""

import os

from ..errors import ConfigError

MAY_CHANGE = (
    "trainer.epochs",
    "trainer.log_every",
    "trainer.hist_every",
    "trainer.progress",
    "trainer.resume",
    "trainer.resume_override",
    "trainer.device",
    "trainer.backend",
    "trainer.compile",
    "trainer.channels_last",
    "trainer.deterministic",
    "trainer.dist_timeout",
    "data.num_workers",
    "data.pin_memory",
    "data.root",
    "data.train_dir",
    "data.val_dir",
    "data.download",
    "data.skip_corrupt",
    "trainer.precise_bn",
    "logger",
)
NEVER = (
    "model",
    "optim.name",
    "task.name",
    "task.teacher",
    "task.teacher_model",
    "task.teacher_layer",
    "data.name",
    "data.num_classes",
    "data.in_channels",
)
ABSENT = "<absent>"


def _matches(key, names):
    return any(key == n or key.startswith(n + ".") for n in names)


def flatten(node, prefix=""):
    """{dotted key: value} of a nested dict (lists stay values)."""
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _same(a, b):
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def config_changes(stored, current):
    """{"allowed", "refused", "never"}: lists of (key, checkpoint value, new value); "unrecorded": keys."""
    old, new = flatten(stored), flatten(current)
    out = {"allowed": [], "refused": [], "never": [], "unrecorded": []}
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out["unrecorded"].append(key)
            continue
        a, b = old[key], new.get(key, ABSENT)
        if _same(a, b):
            continue
        kind = "never" if _matches(key, NEVER) else "allowed" if _matches(key, MAY_CHANGE) else "refused"
        out[kind].append((key, a, b))
    return out


def describe(changes):
    return ", ".join(f"{k}={b} (the checkpoint's: {a})" for k, a, b in changes)


def check_changes(changes, source, override):
    """ConfigError for a NEVER change, or for other changes without trainer.resume_override=true."""
    fresh = "start a fresh run dir (hydra.run.dir=...)"
    if changes["never"]:
        raise ConfigError(
            f"{source} cannot be resumed with {describe(changes['never'])}: the checkpoint's weights "
            f"and optimizer state belong to the old value(s), so they cannot change on resume (not "
            f"even with trainer.resume_override=true); resume with the checkpoint's values, or {fresh}."
        )
    if changes["refused"] and not override:
        keys = ", ".join(k for k, _, _ in changes["refused"])
        raise ConfigError(
            f"{source} was trained with other settings ({keys} differ): {describe(changes['refused'])}. "
            f"A resume may change only {', '.join(MAY_CHANGE)}. Resume with the checkpoint's values, "
            f"{fresh}, or pass trainer.resume_override=true to apply the new values from the resume "
            f"point on (logged, and recorded in config.yaml and the checkpoints)."
        )


def _history(run_dir, ckpt_dir):
    found = []
    best = os.path.join(ckpt_dir, "best.pt")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(best):
        found.append(best)
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append(metrics)
    return found


def choose_resume(resume, run_dir, ckpt_dir):
    """(checkpoint path or None, note for the log or None); ConfigError for a run dir whose history has no last.pt.

    ``resume`` is trainer.resume (None or a path).
    """
    own = os.path.abspath(os.path.join(ckpt_dir, "last.pt"))
    given = os.path.abspath(str(resume)) if resume else None
    if given and os.path.isdir(given):  # a run dir: its latest state
        given = os.path.join(given, "checkpoints", "last.pt")
    if os.path.isfile(own):
        note = None
        if given and given != own:
            note = (
                f"the run dir's own {own} wins over trainer.resume={resume}: resuming the run's latest state "
                f"(to start from {resume} instead, use a fresh run dir)"
            )
        return own, note
    if given:
        return given, None
    history = _history(run_dir, ckpt_dir)
    if history:
        best = os.path.join(ckpt_dir, "best.pt")
        resume_best = f"resume from the best epoch with trainer.resume={best}, " if best in history else ""
        raise ConfigError(
            f"the run dir {run_dir} holds a run's history ({', '.join(history)}) but no "
            f"checkpoints/last.pt, so starting here would overwrite it; {resume_best}start in a fresh "
            f"dir with hydra.run.dir=..., or delete {' and '.join(history)} to start over here."
        )
    return None, None
