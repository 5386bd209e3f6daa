"""DeepSpeed ZeRO stage-2 training of LISA (ILS.md §17.4, issue 12 item 6) for
:func:`cxrground.models.lisa.training.train`, used when :func:`~cxrground.models.lisa.distributed.check_deepspeed`
says so (``distributed=deepspeed``, an accelerate DeepSpeed launch or the ``deepspeed`` launcher).

- Engine: ``deepspeed.initialize`` with the trainer's own AdamW over the trainable parameters, its LR schedule and
  :func:`zero_config`: the ZeRO-2 settings of :func:`~cxrground.models.lisa.loading.deepspeed_config` for the world
  size ``W`` (train batch = the global batch, micro batch, accumulation = global / (micro · W); contiguous
  gradients, overlapped communication, 5e8 buckets), bf16 when the model is bf16 (CUDA) and float32 otherwise
  (CPU), clipping ``grad_clip``. ZeRO-2 shards the gradients and the AdamW state (with an fp32 master copy of the
  weights) over the ranks; every rank keeps the whole model, so validation and the exported weights are as in
  the data-parallel path.
- Steps: the global batch, its micro-batch order, the per-micro-batch seeding and the split over ranks (rank ``r``
  computes micro-batches ``r, r+W, …``) are those of the data-parallel path. ZeRO-2 reduces gradients during every
  backward, so every rank runs the same number of micro-batches, ``ceil(#micro-batches / W)``: a rank short of
  one (the short last batch of an epoch) repeats micro-batch 0 with weight 0. The accumulation boundary is set by
  hand on each rank's last micro-batch, then one ``engine.step()`` reduces, clips, steps AdamW and the schedule.
- Loss scaling: the trainer weights micro-batch ``i`` by ``n_i / B`` (its share of the global batch ``B``);
  DeepSpeed would divide each loss by the accumulation steps (``scale_wrt_gas``, turned off here) and averages
  the gradients over the ``W`` ranks, so :meth:`ZeroEngine.backward` passes ``loss · W · n_i / B`` and the reduced
  gradient is ``Σ_i (n_i / B) ∇loss_i``, the one-process gradient, also for a short last batch.
- Resume state: ``engine.save_checkpoint`` into ``out/resume/ds/step_NNNNNNNN/`` (every rank its own
  ``zero_pp_rank_R_mp_rank_00_optim_states.pt``; rank 0 ``mp_rank_00_model_states.pt`` = trainable weights,
  LR schedule and the trainer's step / epoch / best / history in ``client_state``). Once every rank is done,
  rank 0 writes ``cxrground.json`` (run identity, world size) into that folder, points ``latest`` at it (both
  atomically) and removes the older step folders. Resuming reads ``latest``, refuses another dataset / seed /
  configuration or another number of processes (the shards are per rank) with a :class:`ConfigError` before
  loading, then ``engine.load_checkpoint`` restores weights, AdamW shards and schedule.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Final

import torch

from cxrground.errors import ConfigError, InputError
from cxrground.io.files import atomic_write_text, read_json_object
from cxrground.models.lisa.distributed import DistContext
from cxrground.models.lisa.loading import deepspeed_config

__all__ = ["RESUME_DIR", "STATE_FILE", "ZeroEngine", "zero_config"]

#: The ZeRO-2 resume state's folder under the training output folder.
RESUME_DIR: Final[str] = "resume/ds"
#: The run identity written next to each saved step's shards.
STATE_FILE: Final[str] = "cxrground.json"
_LATEST: Final[str] = "latest"
_NO_PRINT: Final[int] = 1 << 62


def zero_config(config: Any, world_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed configuration of a ZeRO-2 training run of ``world_size`` processes whose weights are ``dtype``."""
    if dtype == torch.float16:
        raise ConfigError("DeepSpeed training runs in bfloat16 (CUDA) or float32 (CPU); float16 would need loss "
                          "scaling: set dtype=bfloat16, float32 or auto")
    ds = deepspeed_config(config, world_size)
    ds["bf16"] = {"enabled": dtype == torch.bfloat16}
    ds["steps_per_print"] = _NO_PRINT
    ds["wall_clock_breakdown"] = False
    return ds


def same_identity(saved: Any, identity: dict[str, Any]) -> bool:
    """Whether a resume state's run identity ``saved`` is ``identity``; a state without the ``pairs`` record (the
    sha256 of the pairs whose image was found) is compared without it."""
    if not isinstance(saved, dict):
        return False
    want = json.loads(json.dumps(identity))
    if "pairs" not in saved:
        want.pop("pairs", None)
    return saved == want


class ZeroEngine:
    """A DeepSpeed ZeRO-2 engine around the trainer's model, AdamW and schedule (see the module docstring)."""

    def __init__(self, engine: Any, ctx: DistContext) -> None:
        self.engine = engine
        self.ctx = ctx

    @classmethod
    def create(cls, model: torch.nn.Module, optim: torch.optim.Optimizer, sched: Any, config: Any,
               ctx: DistContext) -> ZeroEngine:
        """Wrap ``model`` / ``optim`` / ``sched`` (already on the device, in the training dtype) in a ZeRO-2 engine."""
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        dtype = next(p.dtype for p in model.parameters() if p.requires_grad)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optim, lr_scheduler=sched,
                                               config=zero_config(config, ctx.world_size, dtype))
        return cls(engine, ctx)

    def forward(self, batch: tuple, weights: tuple[float, float, float]) -> Any:
        """The model's loss on one micro-batch, through the engine."""
        return self.engine(*batch, weights=weights)

    def backward(self, loss: torch.Tensor, share: float, last: bool) -> None:
        """Accumulate ``share ·`` ∇``loss`` into the global batch's gradient (``last``: the rank's last micro-batch)."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * (share * self.ctx.world_size), scale_wrt_gas=False)

    def step(self) -> None:
        """Reduce the gradients, clip, take the AdamW and schedule step."""
        self.engine.step()

    def save(self, folder: Path, step: int, trainer_state: dict[str, Any], identity: dict[str, Any],
             data: dict[str, Any] | None = None) -> None:
        """Write the resume state of optimiser step ``step`` (every rank calls this; see the module docstring);
        ``data``: the run's usable pairs (:func:`~cxrground.models.train_failures.usable_pairs`), kept beside."""
        tag = f"step_{step:08d}"
        self.engine.save_checkpoint(str(folder), tag=tag, client_state={"cxrground": trainer_state},
                                    save_latest=False, exclude_frozen_parameters=True)
        if not self.ctx.is_main:
            return
        meta = {"identity": identity, "world_size": self.ctx.world_size, "step": step, "data": data}
        atomic_write_text(folder / tag / STATE_FILE, json.dumps(meta, indent=1, sort_keys=True))
        atomic_write_text(folder / _LATEST, tag)
        for old in folder.glob("step_*"):
            if old.name != tag and old.is_dir():
                shutil.rmtree(old)

    @staticmethod
    def saved_meta(folder: Path) -> dict[str, Any] | None:
        """What :meth:`save` wrote beside the latest resume state in ``folder`` (identity, world size, step, usable
        pairs), with its ``tag``; ``None`` when none was saved. Needs no engine."""
        latest = folder / _LATEST
        if not latest.is_file():
            return None
        tag = latest.read_text(encoding="utf-8").strip()
        meta = read_json_object(folder / tag / STATE_FILE, "ZeRO-2 resume state")
        return {**meta, "tag": tag}

    def load(self, folder: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
        """Restore the resume state in ``folder`` into the engine; the trainer's state (``None``: none saved)."""
        meta = self.saved_meta(folder)
        if meta is None:
            return None
        tag = meta["tag"]
        meta_path = folder / tag / STATE_FILE
        if not same_identity(meta.get("identity"), identity):
            raise ConfigError(f"{meta_path} was written for another dataset/seed/configuration; "
                              "use a new --out or --no-resume")
        if meta.get("world_size") != self.ctx.world_size:
            raise ConfigError(f"{meta_path}: the ZeRO-2 state is sharded over {meta.get('world_size')} processes; "
                              f"resume with that many (this run has {self.ctx.world_size}), or use a new --out")
        path, client = self.engine.load_checkpoint(str(folder), tag=tag, load_module_strict=False,
                                                   load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None or "cxrground" not in (client or {}):
            raise InputError("DeepSpeed could not load the ZeRO-2 resume state", folder / tag)
        return client["cxrground"]
