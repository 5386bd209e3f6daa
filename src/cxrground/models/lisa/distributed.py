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

DeepSpeed (``distributed="deepspeed"``, or ``accelerate launch`` with the DeepSpeed configuration of
:func:`cxrground.models.lisa.loading.write_launch_files`) is refused with a :class:`ConfigError`: a clear
install message when deepspeed is not importable, and otherwise the statement that the built-in trainer
does not run ZeRO-2 (use ``ddp``; the written ``ds_config.json`` is the paper's ZeRO-2 setting for a
DeepSpeed trainer).
"""

from __future__ import annotations

import importlib.util
import os
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

    def barrier(self) -> None:
        """Wait for every rank (no-op in one process)."""
        if self.active:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group if this context created it."""
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _deepspeed_requested(mode: str) -> bool:
    return mode == "deepspeed" or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes")


def check_deepspeed(mode: str) -> None:
    """Refuse DeepSpeed with a clear :class:`ConfigError` (see the module docstring); other modes pass."""
    if mode not in DISTRIBUTED_MODES:
        raise ConfigError(f"distributed must be one of {DISTRIBUTED_MODES}, got {mode!r}")
    if not _deepspeed_requested(mode):
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("DeepSpeed training was asked for (distributed=deepspeed or an accelerate DeepSpeed "
                          "config) but deepspeed is not importable: pip install deepspeed (needs CUDA), or launch "
                          "with torchrun / accelerate's multi-GPU config for data-parallel training "
                          "(distributed=auto)")
    raise ConfigError("the built-in LISA trainer runs data-parallel (distributed=auto/ddp) and not DeepSpeed ZeRO-2; "
                      "launch with torchrun or accelerate's multi-GPU config (accelerate_ddp.json)")


def setup_distributed(mode: str, cuda: bool) -> DistContext:
    """Join (or reuse) the process group when the run is data-parallel; one-process context otherwise.

    ``cuda``: train on GPUs (NCCL, device ``cuda:LOCAL_RANK``) rather than on the CPU (gloo).
    """
    check_deepspeed(mode)
    world = _env_int("WORLD_SIZE", 1)
    if mode == "auto" and world <= 1:
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
        return DistContext(torch.distributed.get_rank(), torch.distributed.get_world_size(), local, device, False)
    missing = [v for v in _LAUNCH_VARS if not os.environ.get(v)]
    if missing:
        raise ConfigError(f"distributed={mode} needs the launcher's environment ({', '.join(missing)} unset): "
                          "start the run with torchrun or accelerate launch")
    torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank,
                                         world_size=world)
    return DistContext(rank, world, local, device, True)


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
