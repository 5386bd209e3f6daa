"""The ILS model interface shared by every model backend, the predictor CLI and the server.

A model answers one instruction on one image with an :class:`IlsOutput`: the answer text, a mask at
the image's **native** size and the structured reading of the result. Backends live in one module each
(``cxrground.models.<name>``) and are looked up lazily through :data:`MODEL_MODULES`, so that heavy
libraries (``transformers``, ``peft``) are imported only when their backend is used.

A checkpoint is a folder with ``checkpoint.json`` (at least ``{"model": "<backend name>", ...}``);
:func:`load_model` reads that key and hands the folder to the backend's ``load_model``.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.io.image import CXRImage

__all__ = [
    "CHECKPOINT_FILE",
    "MODEL_MODULES",
    "IlsModel",
    "IlsOutput",
    "checkpoint_info",
    "load_model",
    "model_module",
]

#: Backend name -> module that provides ``load_model(checkpoint_dir, device=...) -> IlsModel`` and
#: ``train(...)``. Adding a backend = one module + one line here.
MODEL_MODULES: Final[dict[str, str]] = {
    "baseline": "cxrground.models.baseline",
    "lisa": "cxrground.models.lisa",
}

#: Name of the JSON file that identifies a checkpoint folder and its backend.
CHECKPOINT_FILE: Final[str] = "checkpoint.json"


@dataclass(frozen=True)
class IlsOutput:
    """One model answer: text, native-size mask and its structured reading.

    ``lesion``/``locations``/``kind`` are what the model understood from the instruction
    (``kind`` in basic / global / lesion_inference); ``present`` is the model's decision that the
    lesion is there, ``presence`` its probability, ``certainty`` ``definitive``/``tentative`` for a
    lesion-inference answer (else None).
    """

    answer: str
    mask: np.ndarray
    presence: float
    present: bool
    lesion: str | None = None
    locations: list[str] = field(default_factory=list)
    kind: str | None = None
    certainty: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def structured(self) -> dict[str, Any]:
        """The JSON-ready structured result (no mask)."""
        return {
            "lesion": self.lesion,
            "locations": list(self.locations),
            "instruction_type": self.kind,
            "present": bool(self.present),
            "presence_probability": float(self.presence),
            "certainty": self.certainty,
        }


@runtime_checkable
class IlsModel(Protocol):
    """What every ILS backend provides once loaded."""

    name: str

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        """Answer ``instruction`` on ``image``; the mask has the image's native ``H×W``."""
        ...

    def predict_batch(self, images: list[CXRImage], instructions: list[str]) -> list[IlsOutput]:
        """Answer several (image, instruction) pairs; same results as calling :meth:`predict` on each."""
        ...


def model_module(name: str) -> Any:
    """Import the backend module registered under ``name``."""
    try:
        module_name = MODEL_MODULES[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; choose from {sorted(MODEL_MODULES)}") from None
    return importlib.import_module(module_name)


def checkpoint_info(checkpoint: str | Path) -> dict[str, Any]:
    """Read ``checkpoint.json`` of a checkpoint folder (clear error when it is not one)."""
    path = Path(checkpoint)
    meta = path / CHECKPOINT_FILE if path.is_dir() else path
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"not a cxrground checkpoint (no {CHECKPOINT_FILE})", path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"unreadable {CHECKPOINT_FILE} ({exc})", meta) from exc
    if not isinstance(info, dict) or not isinstance(info.get("model"), str):
        raise InputError(f"{CHECKPOINT_FILE} has no 'model' name", meta)
    return info


def load_model(checkpoint: str | Path, device: str = "cpu", **options: Any) -> IlsModel:
    """Load any checkpoint folder with the backend its ``checkpoint.json`` names (``options``: backend loading
    options, e.g. LISA's ``quantize`` / ``device_map``; only passed when given)."""
    path = Path(checkpoint)
    info = checkpoint_info(path)
    folder = path if path.is_dir() else path.parent
    return model_module(info["model"]).load_model(folder, device=device, **options)
