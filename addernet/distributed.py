"""torchrun helpers: initialise from the environment torchrun (or SLURM) sets, rank/world queries, reductions.

Nothing here launches processes: ``torchrun`` (torch.distributed.run) does that and sets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; :func:`init_distributed` reads them through
torch.distributed.init_process_group. Outside torchrun every helper degrades to the
single-process answer, so callers never branch on "distributed or not".
"""

import datetime
import os
import re

import torch
import torch.distributed as dist

from .errors import PeerFailure


def first_host(nodelist):
    """The first host name of a SLURM node list: "gpu[07-09,12],cpu3" -> "gpu07"."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}")
    return m[1] + (re.split(r"[-,]", m[2])[0] if m[2] else "")


def adopt_slurm_environment(environ=os.environ):
    """torchrun's variables from SLURM's, for one process per task started by srun / submitit (SLURM launcher).

    Only when SLURM runs more than one task and torchrun's RANK is not set: RANK = SLURM_PROCID, WORLD_SIZE =
    SLURM_NTASKS, LOCAL_RANK = SLURM_LOCALID, MASTER_ADDR = the job's first node, MASTER_PORT = 20000 +
    SLURM_JOB_ID % 20000 (unless set). Every task computes the same values, multi-node included.
    """
    if "RANK" in environ or int(environ.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in environ:
        return False
    environ["RANK"], environ["WORLD_SIZE"] = environ["SLURM_PROCID"], environ["SLURM_NTASKS"]
    environ["LOCAL_RANK"] = environ.get("SLURM_LOCALID", "0")
    environ.setdefault("MASTER_ADDR", first_host(environ.get("SLURM_JOB_NODELIST") or environ["SLURM_NODELIST"]))
    environ.setdefault("MASTER_PORT", str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000))
    return True


def env_world_size():
    """World size torchrun (or SLURM) announced in the environment (1 when not launched by either)."""
    adopt_slurm_environment()
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_rank():
    """Global rank from the environment (0 when not launched by torchrun or SLURM)."""
    adopt_slurm_environment()
    return int(os.environ.get("RANK", "0"))


DEFAULT_TIMEOUT_S = 600
_flag_group = None  # the gloo group of the stop vote (StopVote); created with the process group


def init_distributed(device_type="cpu", timeout_s=DEFAULT_TIMEOUT_S):
    """Join the torchrun process group if WORLD_SIZE > 1: NCCL for CUDA, gloo for CPU.

    ``timeout_s``: how long a collective waits for a stalled rank before it fails (torch's default is
    30 minutes of silence). A CPU (gloo) group for the stop vote is created alongside.
    Returns the device this process should use: ``cuda:LOCAL_RANK`` when device_type is "cuda",
    else the CPU. Idempotent.
    """
    global _flag_group
    adopt_slurm_environment()
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if env_world_size() > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=float(timeout_s))
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=timeout)
        _flag_group = dist.new_group(backend="gloo", timeout=timeout)
    return device


class StopVote:
    """Agree across ranks on a host-side flag once per step, without a device synchronisation.

    ``poll(flag)`` returns the agreement (any rank's flag) of the vote started at the previous call and
    starts the next one: a non-blocking all-reduce of one integer over a CPU (gloo) group, so the GPU
    stream never waits and every rank gets the same answer at the same step, one step after the flag
    was raised. One process: ``poll`` returns the flag at once.
    """

    def __init__(self):
        self.work = self.buf = None

    def poll(self, flag):
        if not is_distributed():
            return bool(flag)
        agreed = self.finish()
        if not agreed:
            self.buf = torch.tensor([int(bool(flag))], dtype=torch.int32)
            self.work = dist.all_reduce(self.buf, op=dist.ReduceOp.MAX, group=_flag_group, async_op=True)
        return agreed

    def finish(self):
        """Wait for the vote in flight (if any); its agreement."""
        if self.work is None:
            return False
        self.work.wait()
        self.work = None
        return bool(self.buf.item())


def is_distributed():
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank():
    return dist.get_rank() if is_distributed() else 0


def get_world_size():
    return dist.get_world_size() if is_distributed() else 1


def is_main():
    """True on the one process that writes files and logs (global rank 0)."""
    return get_rank() == 0


def barrier():
    if is_distributed():
        dist.barrier()


def all_reduce_sum(tensor):
    """Sum ``tensor`` in place over all ranks (no-op on one process); returns it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag, device="cpu"):
    """True if ``flag`` is true on any rank (used to stop every rank at the same step)."""
    if not is_distributed():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_object(obj, src=0):
    """Rank ``src``'s ``obj`` on every rank (picklable objects only)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def peer_failure(error, timeout_s):
    """A PeerFailure explaining ``error`` when it is a collective that timed out or broke, else None."""
    text = str(error)
    if not is_distributed() or not (
        isinstance(error, dist.DistError)
        or (
            isinstance(error, RuntimeError)
            and any(w in text.lower() for w in ("timed out", "timeout", "gloo", "nccl", "connection closed", "peer"))
        )
    ):
        return None
    return PeerFailure(
        f"rank {get_rank()} of {get_world_size()}: a collective operation failed after waiting for the "
        f"other processes (trainer.dist_timeout={timeout_s:g} s): another rank stalled or died; its "
        f"own log or stderr says why (a hung data loader or file system is the usual cause). "
        f"checkpoints/last.pt holds the last completed save: re-run the same command to resume, or "
        f"raise trainer.dist_timeout if a rank legitimately works that long alone. "
        f"({text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__})"
    )


def cleanup():
    """Leave the process group (call once at the end of the job)."""
    global _flag_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _flag_group = None
