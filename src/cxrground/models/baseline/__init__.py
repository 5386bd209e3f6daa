"""The CPU baseline ILS model (``--model baseline``): a FiLM-conditioned U-Net with presence and answer heads.

The instruction is parsed back into its template slots (:func:`cxrground.vocab.ils_templates.parse_instruction`)
and encoded as a fixed vector (:mod:`.conditioning`); the network (:mod:`.net`) sees the image at a small
working size (:mod:`.config`, default 128 px) together with lung masks from the shipped lung U-Net and the
instruction's location-label masks; answers are rendered from the ILS templates only. Training:
:mod:`.training`; inference rule: :mod:`.model`. torch is imported only when :func:`train` or
:func:`load_model` is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from cxrground.models.base import IlsModel

__all__ = ["load_model", "train"]


def train(dataset: Path, out: Path, *, images: Path | None = None, seed: int = 0,
          overrides: dict[str, Any] | None = None, resume: bool = True, split: str = "train",
          val_split: str | None = "val", **kwargs: Any) -> Path:
    """Train the baseline into the checkpoint folder ``out`` (see :func:`.training.train`)."""
    from cxrground.models.baseline.training import train as _train

    return _train(dataset, out, images=images, seed=seed, overrides=overrides, resume=resume, split=split,
                  val_split=val_split, **kwargs)


def load_model(checkpoint_dir: Path, device: str = "cpu", **kwargs: Any) -> IlsModel:
    """Load a baseline checkpoint folder as an :class:`~cxrground.models.base.IlsModel`."""
    from cxrground.models.baseline.model import load_model as _load

    return _load(checkpoint_dir, device=device, **kwargs)
