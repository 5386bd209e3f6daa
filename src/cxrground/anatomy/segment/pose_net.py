"""The pose reader: a small CNN that tells in which of eight poses a frontal film is stored.

A film can reach a dataset turned a quarter or half turn, flipped, or mirrored left-right; a mirrored film keeps
upright-looking lungs, so no lung check can tell, and every side an ILS pair names is then wrong. The pose reader
learns a chest's asymmetric anatomy (heart and apex on the patient's left, aortic knob, gastric bubble, the higher
right hemidiaphragm) from upright films put in each pose of the square's symmetry group: four quarter turns, each
without or with a left-right mirror (:data:`POSE_CLASSES`). The labels are made by the transform; no annotation is
read. Training recipe: :mod:`cxrground.models.pose_net`; validation and the rule that decided how the check uses
it: ``bench/records/pose_net_preregistration.md`` and ``bench/pose_net.py``.

Input: the grey film letterboxed onto a 128 × 128 canvas and z-scored over the un-padded region
(:func:`~cxrground.anatomy.segment.unet.prepare_input`). Network (:class:`PoseNetConfig`): five blocks of
3 × 3 convolution, batch norm, ReLU and 2 × 2 max-pool, a 1 × 1 convolution, and a linear layer on the flattened
4 × 4 map (spatial layout kept: the side of the heart is the point). Output: 8 logits (softmax).

Model file: ``NAME.safetensors`` plus the sidecar ``NAME.json`` (``format`` :data:`FORMAT`, the architecture,
the classes, the recipe, the training films, ``sha256``). torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from cxrground.errors import ConfigError
from cxrground.io.files import atomic_path, model_paths, read_model_sidecar, sha256_file

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DEFAULT_POSE_WEIGHTS", "FORMAT", "POSE_CLASSES", "PoseNetConfig", "PoseReader", "PoseReading",
           "apply_pose", "build_pose_net", "correction_name", "load_pose_net", "pose_canvas", "pose_reader_record",
           "pose_warning", "read_pose_sidecar", "save_pose_net", "shipped_pose_reader", "undo_pose"]

FORMAT: Final[str] = "cxrground-posenet/1"

#: The name of the shipped weights (``weights/NAME.safetensors`` inside the package).
DEFAULT_POSE_WEIGHTS: Final[str] = "pose_net_v1"

#: The eight poses, as (quarter turns counter-clockwise, mirrored first) of the upright film; class 0 is upright.
POSE_CLASSES: Final[tuple[tuple[int, bool], ...]] = (
    (0, False), (1, False), (2, False), (3, False), (0, True), (1, True), (2, True), (3, True))

#: What puts a film stored in each pose right (the names of :data:`~.orientation.POSES` where they exist).
_CORRECTIONS: Final[dict[tuple[int, bool], str]] = {
    (0, False): "none",
    (1, False): "turned 90° clockwise",
    (2, False): "turned 180°",
    (3, False): "turned 90° counter-clockwise",
    (0, True): "mirrored left-right",
    (1, True): "turned 90° clockwise, then mirrored left-right",
    (2, True): "flipped top-bottom",
    (3, True): "turned 90° counter-clockwise, then mirrored left-right",
}


def apply_pose(pixels: np.ndarray, pose: tuple[int, bool]) -> np.ndarray:
    """The upright ``pixels`` stored in ``pose`` (mirrored left-right first, then turned counter-clockwise)."""
    turns, mirrored = pose
    out = pixels[:, ::-1] if mirrored else pixels
    return np.ascontiguousarray(np.rot90(out, turns))


def undo_pose(pixels: np.ndarray, pose: tuple[int, bool]) -> np.ndarray:
    """A film stored in ``pose`` put upright (the inverse of :func:`apply_pose`)."""
    turns, mirrored = pose
    out = np.rot90(pixels, -turns)
    return np.ascontiguousarray(out[:, ::-1] if mirrored else out)


def correction_name(pose: tuple[int, bool]) -> str:
    """What puts a film stored in ``pose`` right, in words (``"none"`` for upright)."""
    return _CORRECTIONS[pose]


@dataclass(frozen=True)
class PoseNetConfig:
    """The pose reader's architecture."""

    input_size: int = 128
    channels: tuple[int, ...] = (8, 16, 32, 64, 128)
    head_channels: int = 32
    dropout: float = 0.3

    def __post_init__(self) -> None:
        if self.input_size % (2 ** len(self.channels)):
            raise ConfigError(f"input_size {self.input_size} must be divisible by 2**{len(self.channels)}")

    @property
    def feature_side(self) -> int:
        """Side of the last feature map."""
        return self.input_size // 2 ** len(self.channels)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["channels"] = list(self.channels)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoseNetConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(input_size=int(data["input_size"]), channels=tuple(int(c) for c in data["channels"]),
                   head_channels=int(data["head_channels"]), dropout=float(data["dropout"]))


def build_pose_net(config: PoseNetConfig | None = None) -> torch.nn.Module:
    """A freshly initialised pose reader network."""
    from torch import nn

    config = config or PoseNetConfig()
    layers: list[nn.Module] = []
    cin = 1
    for cout in config.channels:
        layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                   nn.MaxPool2d(2)]
        cin = cout
    layers += [nn.Conv2d(cin, config.head_channels, 1), nn.ReLU(inplace=True), nn.Flatten(),
               nn.Dropout(config.dropout),
               nn.Linear(config.head_channels * config.feature_side ** 2, len(POSE_CLASSES))]
    return nn.Sequential(*layers)


def pose_canvas(pixels: np.ndarray, size: int = 128) -> np.ndarray:
    """Grey ``(H, W)`` pixels → the normalised ``(size, size)`` canvas the reader takes."""
    from cxrground.anatomy.segment.unet import prepare_input

    grey = pixels if pixels.dtype == np.uint8 else np.clip(pixels, 0, 255).astype(np.uint8)
    return prepare_input(grey, size)[0]


def save_pose_net(model: torch.nn.Module, config: PoseNetConfig, path: str | Path,
                  sidecar: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``path.safetensors`` (float32) + ``path.json``; returns both paths."""
    from safetensors.torch import save_file

    weights_path, json_path = model_paths(path)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(weights_path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp),
                  metadata={"format": FORMAT})
    meta = {"format": FORMAT, "name": weights_path.stem, "architecture": config.to_dict(),
            "input": {"size": config.input_size, "channels": "grey", "letterbox": "fit-center", "pad_value": 0,
                      "normalisation": "zscore-valid"},
            "classes": [{"turns_ccw": t, "mirrored": m, "correction": correction_name((t, m))}
                        for t, m in POSE_CLASSES],
            **(sidecar or {}), "sha256": sha256_file(weights_path)}
    json_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return weights_path, json_path


def read_pose_sidecar(path: str | Path) -> dict[str, Any]:
    """The JSON sidecar of pose reader weights (``path`` may name either file or the stem)."""
    return read_model_sidecar(path, FORMAT, "pose reader")


def load_pose_net(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load pose reader weights + sidecar into an eval-mode network; checks the sha256."""
    from cxrground.anatomy.segment.unet import load_weights_into

    weights_path, _ = model_paths(path)
    if not weights_path.is_file():
        raise ConfigError(f"pose reader weights {weights_path} not found")
    meta = read_pose_sidecar(weights_path)
    digest = sha256_file(weights_path)
    if digest != meta.get("sha256"):
        raise ConfigError(f"{weights_path}: sha256 {digest} does not match its sidecar ({meta.get('sha256')})")
    config = PoseNetConfig.from_dict(meta["architecture"])
    return load_weights_into(build_pose_net(config), weights_path), meta


@dataclass(frozen=True)
class PoseReading:
    """The reader's probabilities of the eight poses (:data:`POSE_CLASSES` order)."""

    probabilities: tuple[float, ...]

    @property
    def pose(self) -> tuple[int, bool]:
        """The most probable pose."""
        return POSE_CLASSES[int(np.argmax(self.probabilities))]

    @property
    def upright(self) -> bool:
        """Upright is the most probable pose."""
        return self.pose == POSE_CLASSES[0]

    @property
    def correction(self) -> str:
        """What puts the film right, in words (``"none"`` when it reads upright)."""
        return correction_name(self.pose)

    @property
    def confidence(self) -> float:
        """Probability of the most probable pose."""
        return float(max(self.probabilities))


class PoseReader:
    """Reads the pose of films with the weights at ``path`` (CPU; loads on first use; thread-safe)."""

    def __init__(self, path: str | Path, threads: int | None = 1) -> None:
        self.path = model_paths(path)[0]
        self.threads = threads
        self._lock = threading.Lock()
        self._model: Any = None
        self._size = 128

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model, meta = load_pose_net(self.path)
                self._size = int(meta["architecture"]["input_size"])
            return self._model

    def load(self) -> PoseReader:
        """Load the weights now (a :class:`ConfigError` naming the file when they cannot be); returns ``self``."""
        self._loaded()
        return self

    def read_many(self, films: Sequence[np.ndarray]) -> list[PoseReading]:
        """The pose readings of grey films ``(H, W)`` as stored."""
        import torch

        model = self._loaded()
        batch = torch.from_numpy(np.stack([pose_canvas(f, self._size) for f in films]))[:, None]
        prev = torch.get_num_threads()
        try:
            if self.threads:
                torch.set_num_threads(int(self.threads))
            with torch.inference_mode():
                probs = torch.softmax(model(batch), dim=1).numpy()
        finally:
            torch.set_num_threads(prev)
        return [PoseReading(tuple(float(v) for v in row)) for row in probs]

    def read(self, pixels: np.ndarray) -> PoseReading:
        """The pose reading of one grey film as stored."""
        return self.read_many([pixels])[0]


def shipped_pose_path() -> Path:
    """Where the shipped pose reader's weights lie in the package."""
    return Path(__file__).parent / "weights" / f"{DEFAULT_POSE_WEIGHTS}.safetensors"


@functools.cache
def shipped_pose_reader() -> PoseReader:
    """The pose reader with the shipped weights (one per process; torch's thread count as the process set it)."""
    return PoseReader(shipped_pose_path(), threads=None)


@functools.lru_cache(maxsize=4)
def pose_reader_at(path: str | None) -> PoseReader:
    """The pose reader with the weights at ``path`` (None: the shipped ones), one per process and path; torch's
    thread count as the process set it."""
    return shipped_pose_reader() if path is None else PoseReader(path, threads=None)


def pose_warning(pixels: np.ndarray, reader: PoseReader | None = None) -> dict[str, Any] | None:
    """``{"correction", "p", "p_upright"}`` when the film looks stored in a wrong pose (by ``reader``, default the
    shipped one), else None: a warning for a person to check, not a verdict (see the module)."""
    reading = (reader or shipped_pose_reader()).read(pixels)
    if reading.upright:
        return None
    return {"correction": reading.correction, "p": round(reading.confidence, 4),
            "p_upright": round(reading.probabilities[0], 4)}


def pose_reader_record(reader: PoseReader | None = None) -> dict[str, Any]:
    """Name and sha256 of a pose reader's weights (default: the shipped one), from its sidecar."""
    reader = reader or shipped_pose_reader()
    meta = read_pose_sidecar(reader.path)
    shipped = meta.get("sha256") == read_pose_sidecar(shipped_pose_reader().path).get("sha256")
    return {"name": meta.get("name"), "sha256": meta.get("sha256"),
            "validation": "bench/records/pose_net_preregistration.md" if shipped
            else "the held-out check in the weights' sidecar (data.heldout_check), when trained on your films"}
