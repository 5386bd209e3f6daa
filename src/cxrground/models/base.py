"""The ILS model interface shared by every model backend, the predictor CLI and the server.

A model answers one instruction on one image with an :class:`IlsOutput`: the answer text, a mask at
the image's **native** size and the structured reading of the result. Backends live in one module each
(``cxrground.models.<name>``) and are looked up lazily through the registry :data:`MODELS`, so that heavy
libraries (``transformers``, ``peft``) are imported only when their backend is used.

A checkpoint is a folder with ``checkpoint.json`` (at least ``{"model": "<backend name>", ...}``);
:func:`load_model` reads that key and hands the folder to the backend's ``load_model``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.extras import check_needs
from cxrground.io.image import CXRImage
from cxrground.io.output_lock import locks_output
from cxrground.llm.fingerprint import file_digest
from cxrground.registry import Registry

__all__ = [
    "CHECKPOINT_FILE",
    "MODELS",
    "IlsModel",
    "IlsOutput",
    "check_checkpoint_folder",
    "checkpoint_fingerprint",
    "checkpoint_info",
    "load_model",
    "model_module",
    "train_model",
]

#: ILS model backends by name; each factory imports the backend's module, which provides
#: ``load_model(checkpoint_dir, device=...) -> IlsModel`` and ``train(dataset, out, *, images, seed, overrides,
#: resume, split, val_split, progress) -> Path``. Adding a backend = one module + one registration here.
MODELS: Final[Registry[ModuleType]] = Registry("model")


@MODELS.register("baseline", help="the CPU baseline: FiLM-conditioned U-Net with presence and answer heads",
                 needs=("torch", "safetensors"))
def _baseline() -> ModuleType:
    return importlib.import_module("cxrground.models.baseline")


@MODELS.register("lisa", help="LISA / ROSALIA (LLaVA + SAM + [SEG]); transformers, a GPU for real sizes",
                 needs=("torch", "transformers", "peft", "accelerate"))
def _lisa() -> ModuleType:
    return importlib.import_module("cxrground.models.lisa")

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
    """Import the backend module registered under ``name`` (unknown names raise ``ConfigError``; a backend whose
    libraries are not installed, :class:`~cxrground.errors.MissingExtraError` naming the extra)."""
    MODELS.get(name)
    check_needs([MODELS.need(name)], f"model {name!r}")
    return MODELS.create(name)


@locks_output("ils train", "out")
def train_model(name: str, dataset: str | Path, out: str | Path, **kwargs: Any) -> Path:
    """Train backend ``name`` on an ILS dataset into the checkpoint folder ``out``; returns the folder.

    ``kwargs`` are the common training arguments (``images``, ``seed``, ``overrides``, ``resume``, ``split``,
    ``val_split``, ``progress``) that every backend's ``train`` accepts. Temporary files a killed earlier run
    left in ``out`` (an atomic write cut short) are removed first.
    """
    from cxrground.io.files import remove_stale_temps

    check_checkpoint_folder(out, name)
    _check_splits(Path(dataset), kwargs.get("split", "train"), kwargs.get("val_split"))
    remove_stale_temps(out)
    fresh = not Path(out).exists()
    try:
        return Path(model_module(name).train(Path(dataset), Path(out), **kwargs))
    except BaseException:
        if fresh and Path(out).is_dir() and not any(Path(out).iterdir()):
            Path(out).rmdir()  # a run refused before it wrote anything leaves no empty folder behind
        raise


def _check_splits(dataset: Path, split: str | None, val_split: str | None) -> None:
    """Refuse a training split the dataset does not have, and a validation split other than the default ``val`` it
    does not have (a typo would turn model selection off without a word), before any film is prepared; a dataset
    without ``val`` trains without selection, as documented. The top level is read as a stream."""
    from cxrground.ils.schema import dataset_location, dataset_splits

    path = dataset_location(dataset)[1]
    try:
        splits = dataset_splits(path)
    except InputError:
        return  # the backend reports an unreadable dataset, naming the file
    for flag, name in (("--split", split), ("--val-split", val_split)):
        if name in (None, "") or (flag == "--val-split" and name == "val") or name in splits:
            continue
        raise ConfigError(f"{flag} {name!r} is not a split of {path} (its splits: {', '.join(splits)})")


def check_checkpoint_folder(out: str | Path, name: str) -> None:
    """Refuse (:class:`ConfigError`) to write a checkpoint of backend ``name`` into a folder that holds another
    backend's checkpoint (or an unreadable ``checkpoint.json``): the two would mix, and the other is lost."""
    record = Path(out) / CHECKPOINT_FILE
    if not record.is_file():
        return
    try:
        held = json.loads(record.read_text(encoding="utf-8")).get("model")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"{out} holds a {CHECKPOINT_FILE} that cannot be read; use another --out") from None
    if held != name:
        raise ConfigError(f"{out} holds a {held!r} checkpoint; a {name!r} checkpoint goes into another --out (or "
                          "delete that folder first)")


#: Suffixes of a checkpoint's weight files (fingerprinted by name, size and content beside ``checkpoint.json``):
#: torch, safetensors, GGUF, NumPy, ONNX, pickle/joblib, HDF5/Keras, msgpack (Flax) and TFLite files.
_WEIGHT_SUFFIXES: Final[tuple[str, ...]] = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".npy",
                                            ".onnx", ".pkl", ".pickle", ".joblib", ".h5", ".hdf5", ".keras",
                                            ".msgpack", ".tflite")
#: The ``checkpoint.json`` key listing further files the model loads (paths relative to the folder), fingerprinted
#: as the weight files are: what a backend stores in another format or in a subfolder.
WEIGHT_FILES_KEY: Final[str] = "weight_files"
#: Files beside the weights that hold a training's resume state, not weights a model loads (left out of the
#: fingerprint: they record durations, and a finished training's predictions do not depend on them).
_RESUME_STATE: Final[frozenset[str]] = frozenset({"train_state.pt"})
#: Keys of ``checkpoint.json`` that record how long training took, not what it made (left out of the fingerprint).
_TIMING_KEYS: Final[frozenset[str]] = frozenset({"seconds", "train_seconds", "load_seconds"})


def checkpoint_fingerprint(checkpoint: Path) -> str:
    """A sha256 of the checkpoint's ``checkpoint.json`` (rewritten by every training run and conversion; its
    durations left out) and the names, sizes and contents of its weight files, a file over 8 MiB by sampled blocks
    (:func:`cxrground.llm.fingerprint.file_digest`): two checkpoints with one fingerprint give the same
    predictions, and two identical trainings have one fingerprint. The weight files are those with a suffix of
    :data:`_WEIGHT_SUFFIXES` beside ``checkpoint.json`` and those its ``weight_files`` list names (relative paths, in
    subfolders too; a listed file that is missing counts as missing). The resume state ``train_state.pt`` and files
    written beside the weights (predictions, evaluations) do not count."""
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    h = hashlib.sha256()
    record = folder / CHECKPOINT_FILE
    h.update(_record_bytes(record) if record.is_file() else b"")
    named = {p.name: p for p in folder.iterdir()
             if p.is_file() and p.suffix in _WEIGHT_SUFFIXES and p.name not in _RESUME_STATE}
    for rel in _listed_weight_files(record):
        named.setdefault(rel, folder / rel)
    for name, path in sorted(named.items()):
        if not path.is_file():
            h.update(f"\0{name}\0missing\0".encode())
            continue
        size = path.stat().st_size
        h.update(f"\0{name}\0{size}\0".encode() + file_digest(path, size))
    return h.hexdigest()


def _listed_weight_files(record: Path) -> list[str]:
    """The relative paths ``checkpoint.json`` lists under ``weight_files`` (none when it lists none or is no JSON)."""
    try:
        listed = json.loads(record.read_bytes()).get(WEIGHT_FILES_KEY) if record.is_file() else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return []
    if not isinstance(listed, list):
        return []
    return [Path(str(rel)).as_posix() for rel in listed if isinstance(rel, str) and rel]


def _record_bytes(record: Path) -> bytes:
    """``checkpoint.json`` without its durations (:data:`_TIMING_KEYS`), as canonical JSON; its raw bytes when it is
    not JSON."""
    raw = record.read_bytes()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in _TIMING_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(data), sort_keys=True).encode()


def checkpoint_info(checkpoint: str | Path) -> dict[str, Any]:
    """Read ``checkpoint.json`` of a checkpoint folder (clear error when it is not one)."""
    path = Path(checkpoint)
    meta = path / CHECKPOINT_FILE if path.is_dir() else path
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"not a cxrground checkpoint (no {CHECKPOINT_FILE})", path) from None
    except IsADirectoryError:
        raise InputError(f"{CHECKPOINT_FILE} is a folder, not the checkpoint's description file", meta) from None
    except OSError as exc:
        raise InputError(f"unreadable {CHECKPOINT_FILE} ({exc.strerror or exc})", meta) from exc
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
