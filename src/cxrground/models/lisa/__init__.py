"""The ROSALIA-style LISA model (ILS.md §17): LLaVA (LLaMA + CLIP + linear projector) + SAM + ``[SEG]`` projection.

Backend ``lisa`` of :data:`cxrground.models.base.MODELS`: :func:`train` (``cxrground ils train --model lisa``)
and :func:`load_model` (a checkpoint folder → :class:`~cxrground.models.base.IlsModel`). ``transformers``/``peft``
are imported only when these are called. Modules: :mod:`.config` (defaults = §17.4), :mod:`.text` (LLaVA v1
conversation, ``[SEG]``), :mod:`.preprocess` (SAM/CLIP branches, native frames), :mod:`.model`, :mod:`.training`,
:mod:`.infer` (free generation, teacher-forced segmentation), :mod:`.convert` (released LISA/ROSALIA layout),
:mod:`.checkpoint` (folder format), :mod:`.loading` (8-/4-bit, ``device_map``, multi-GPU launch configuration),
:mod:`.distributed` (data-parallel training under ``torchrun`` / ``accelerate launch``),
:mod:`.zero` (DeepSpeed ZeRO-2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load_model", "train"]


def train(dataset: Path, out: Path, *, images: Path | None = None, seed: int = 0,
          overrides: dict[str, Any] | None = None, resume: bool = True, split: str = "train",
          val_split: str | None = "val", progress: bool = True) -> Path:
    """Train the LISA model on an ILS dataset; see :func:`cxrground.models.lisa.training.train`."""
    from cxrground.models.lisa.training import train as _train

    return _train(dataset, out, images=images, seed=seed, overrides=overrides, resume=resume, split=split,
                  val_split=val_split, progress=progress)


def load_model(checkpoint_dir: Path, device: str = "cpu", **options: Any) -> Any:
    """Load a LISA checkpoint folder as an ``IlsModel``; see :func:`cxrground.models.lisa.infer.load_model`
    (``options``: ``quantize``, ``device_map``)."""
    from cxrground.models.lisa.infer import load_model as _load

    return _load(Path(checkpoint_dir), device=device, **options)

