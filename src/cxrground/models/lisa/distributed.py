"""Data-parallel training support for :func:`cxrground.models.lisa.training.train` (issue 12 item 6).

A run is data-parallel when it is launched by ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` > 1 in the
environment) or when ``distributed="ddp"`` is set explicitly. Each process (rank) joins the
``torch.distributed`` process group (NCCL on CUDA, one GPU per ``LOCAL_RANK``; gloo on CPU), builds the same
model, receives rank 0's trainable weights, and computes its share of every global batch: micro-batches
``r, r+W, r+2W, …`` of the step. After the rank's micro-batches, :func:`all_reduce_gradients` sums the
gradients over the ranks (in float32), so every rank holds the single-process gradient of the whole global
batch and takes the same optimiser step. This is what ``DistributedDataParallel`` with ``no_sync`` over the
accumulation does, done by hand because a rank may have no micro-batch at all (the short last batch of an
epoch) or a parameter no gradient (the SAM IoU head), where DDP's hooks would hang or refuse.

DeepSpeed ZeRO stage 2 (:mod:`cxrground.models.lisa.zero`) is used with ``distributed="deepspeed"``, or with
``distributed="auto"`` under ``accelerate launch`` with the DeepSpeed configuration of
:func:`cxrground.models.lisa.loading.write_launch_files` (``ACCELERATE_USE_DEEPSPEED``) or under the ``deepspeed``
launcher (``CROSS_RANK`` / ``CROSS_SIZE`` / ``LOCAL_SIZE``); ``distributed="ddp"`` is data-parallel whatever the
launcher. It joins the same process group, and a clear :class:`ConfigError` says so when deepspeed is not
importable. DeepSpeed picks its accelerator when it is first imported: on a machine without CUDA
:func:`setup_distributed` sets ``DS_ACCELERATOR=cpu`` (gloo) and refuses any other value; with CUDA DeepSpeed's
own detection is left alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Final

import torch

from cxrground.errors import ConfigError
from cxrground.models.lisa.config import DISTRIBUTED_MODES

__all__ = [
    "DISTRIBUTED_MODES",
    "DistContext",
    "all_reduce_gradients",
    "all_reduce_sum",
    "broadcast_parameters",
    "check_deepspeed",
    "gather_in_order",
    "setup_distributed",
]

#: Elements per all-reduce bucket of :func:`all_reduce_gradients` (float32: 128 MB).
BUCKET_ELEMENTS: Final[int] = 1 << 25
_LAUNCH_VARS: Final[tuple[str, ...]] = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a (possibly one-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"
    owns_group: bool = False
    deepspeed: bool = False

    @property
    def active(self) -> bool:
        """A process group is in use (collectives are called)."""
        return self.world_size > 1 or self.owns_group

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes files and shows progress."""
        return self.rank == 0

    def micro_batches(self, n: int) -> range:
        """Indices of this rank's micro-batches among ``n`` (``rank, rank + W, …``)."""
        return range(self.rank, n, self.world_size)

    def micro_rounds(self, n: int) -> int:
        """Micro-batches every rank runs in lock-step among ``n`` (the most any rank has: ``ceil(n / W)``)."""
        return -(-n // self.world_size)

    def barrier(self) -> None:
        """Wait for every rank (no-op in one process)."""
        if self.active:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group if this context created it (through DeepSpeed once it has used the group, so that
        it drops its cached copies and a later run in this process can start DeepSpeed again)."""
        if not (self.owns_group and torch.distributed.is_initialized()):
            return
        ds_comm = sys.modules.get("deepspeed.comm.comm") if self.deepspeed else None
        if ds_comm is not None and getattr(ds_comm, "cdb", None) is not None:
            ds_comm.destroy_process_group()
        else:
            torch.distributed.destroy_process_group()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


_DEEPSPEED_LAUNCHER_VARS: Final[tuple[str, ...]] = ("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")


def _deepspeed_launch() -> bool:
    """The process was started by ``accelerate launch`` with a DeepSpeed configuration or by ``deepspeed``."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        return True
    return all(os.environ.get(v) for v in _DEEPSPEED_LAUNCHER_VARS)


def check_deepspeed(mode: str) -> bool:
    """Whether this run trains with DeepSpeed ZeRO-2 (see the module docstring); a clear :class:`ConfigError` when it
    should but deepspeed is not importable, or when ``mode`` is unknown."""
    if mode not in DISTRIBUTED_MODES:
        raise ConfigError(f"distributed must be one of {DISTRIBUTED_MODES}, got {mode!r}")
    if not (mode == "deepspeed" or (mode == "auto" and _deepspeed_launch())):
        return False
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("DeepSpeed training was asked for (distributed=deepspeed, an accelerate DeepSpeed config or "
                          "the deepspeed launcher) but deepspeed is not importable: pip install deepspeed "
                          "(cxrground's 'deepspeed' extra), or launch with torchrun / accelerate's multi-GPU config "
                          "for data-parallel training (distributed=auto or ddp)")
    return True


def _deepspeed_accelerator(cuda: bool) -> None:
    """Without CUDA, make DeepSpeed use its CPU accelerator (``DS_ACCELERATOR=cpu``) before it is imported."""
    if cuda:
        return
    name = os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if name != "cpu":
        raise ConfigError(f"DS_ACCELERATOR={name!r} but this machine has no CUDA GPU and the LISA trainer runs on the "
                          "CPU: unset DS_ACCELERATOR or set it to cpu")


def setup_distributed(mode: str, cuda: bool) -> DistContext:
    """Join (or reuse) the process group when the run is data-parallel; one-process context otherwise.

    ``cuda``: train on GPUs (NCCL, device ``cuda:LOCAL_RANK``) rather than on the CPU (gloo).
    """
    zero = check_deepspeed(mode)
    if zero:
        _deepspeed_accelerator(cuda)
    world = _env_int("WORLD_SIZE", 1)
    if mode == "auto" and world <= 1 and not zero:
        return DistContext(device="cuda" if cuda else "cpu")
    if not torch.distributed.is_available():
        raise ConfigError("data-parallel training needs torch.distributed, which this torch build lacks")
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        if local >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local} has no GPU: this machine has {torch.cuda.device_count()}; "
                              "launch at most one process per GPU")
        torch.cuda.set_device(local)
    if torch.distributed.is_initialized():
        return DistContext(torch.distributed.get_rank(), torch.distributed.get_world_size(), local, device, False, zero)
    missing = [v for v in _LAUNCH_VARS if not os.environ.get(v)]
    if missing:
        raise ConfigError(f"distributed={mode} needs the launcher's environment ({', '.join(missing)} unset): "
                          "start the run with torchrun or accelerate launch")
    torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank,
                                         world_size=world)
    return DistContext(rank, world, local, device, True, zero)


def broadcast_parameters(ctx: DistContext, params: list[torch.nn.Parameter]) -> None:
    """Give every rank rank 0's values of ``params`` (e.g. randomly initialised LoRA weights)."""
    if not ctx.active:
        return
    with torch.no_grad():
        for p in params:
            torch.distributed.broadcast(p.data, src=0)


def all_reduce_sum(ctx: DistContext, values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of a float64 CPU vector over the ranks (the same vector in one process)."""
    if not ctx.active:
        return values
    buf = values.to(device=ctx.device, dtype=torch.float64)
    torch.distributed.all_reduce(buf)
    return buf.cpu()


def all_reduce_gradients(ctx: DistContext, params: list[torch.nn.Parameter]) -> None:
    """Replace each ``p.grad`` by its sum over the ranks (float32 buckets); a parameter no rank gave a gradient
    keeps ``grad=None``, as in one process (AdamW then leaves it and its state alone)."""
    if not ctx.active:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=ctx.device)
    torch.distributed.all_reduce(has)
    live = [p for p, flag in zip(params, has.tolist(), strict=True) if flag > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in _buckets(live):
        flat = torch.cat([p.grad.reshape(-1).to(torch.float32) for p in bucket])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    out: list[list[torch.nn.Parameter]] = [[]]
    size = 0
    for p in params:
        if out[-1] and size + p.numel() > BUCKET_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel()
    return [b for b in out if b]


def gather_in_order(ctx: DistContext, items: dict[int, Any], n: int) -> list[Any]:
    """Merge every rank's ``{index: result}`` into the list of the ``n`` results in index order."""
    if ctx.active:
        parts: list[dict[int, Any] | None] = [None] * ctx.world_size
        torch.distributed.all_gather_object(parts, items)
        items = {k: v for part in parts for k, v in (part or {}).items()}
    if sorted(items) != list(range(n)):
        raise RuntimeError(f"gathered results cover {len(items)} of {n} items")
    return [items[i] for i in range(n)]
