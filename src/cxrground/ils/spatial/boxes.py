"""Lesion boxes for Algorithm 1 (ILS §8 row 4): a built-in proposal step and a YOLO (VinDr-CXR) adapter.

:class:`AnomalyBoxDetector` (CPU default) proposes boxes from the signed anomaly map ``(x − x̂)/255``:

1. at each level ``t`` of ``levels``: ``{anomaly ≥ t}``, opened with an elliptical kernel, split into
   8-connected components; components below ``min_area_fraction`` of the image are dropped;
2. one box per component, plus one box per *cluster* of components lying within ``merge_gap`` of each
   other (a patchy lesion made of several foci gets one box around all of them, as a detector would draw
   it);
3. a confidence per box, the product of three factors in [0, 1]:

   - strength ``σ((a90 − strength_mid) / strength_width)``, ``a90`` = 90th percentile of the anomaly inside
     the component(s) (how much brighter than normal), σ the logistic function;
   - size ``σ((ln area − ln(size_mid · image area)) / size_width)`` (small specks are unreliable);
   - compactness ``fill ** compactness_power``, ``fill`` = component pixels / box pixels (a box that is
     mostly empty is a weaker proposal);

   The midpoints and widths were calibrated on the synthetic phantoms (``bench/grounding.py``): normal
   lung structure that survives the pseudo-normal (hila, apices, costophrenic corners) gives small, weak
   components, lesions larger and stronger ones;
4. identical boxes keep the highest confidence; boxes below ``min_confidence`` (default 0.2, the detector's
   own output floor, like ultralytics' ``conf``) are not emitted; at most ``max_boxes`` boxes, sorted by
   confidence. With this floor the Table 7 edema ``τ_conf = 0.01`` is never the binding condition for the
   built-in detector (without it, weak normal-tissue components become edema boxes: on 60 phantoms 57 % of
   the edema queries at lesion-free locations were grounded, 8 % with the floor; edema recall 100 → 85 %).

:class:`YOLOBoxDetector` wraps an ``ultralytics`` checkpoint trained on VinDr-CXR and keeps only the ten
hyperintense classes of ILS §8 (:data:`KEPT_CLASSES`). Detector class names are normalised with
:func:`normalize_class_name` (lower case, ``_``/``-`` → space, spaces around ``/`` removed, known spelling
variants mapped: ``nodule mass`` → ``nodule/mass``, ``ild`` → ``ILD``, ``lung opacity``...). Every class
not kept is dropped, including ``aortic enlargement``, ``other lesion``, ``pneumothorax`` (ILS §8) and
``cardiomegaly`` / ``no finding`` (not lung lesions; cardiomegaly uses the heart mask).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.errors import ConfigError
from cxrground.ils.spatial.base import Box
from cxrground.io.files import sha256_file

__all__ = [
    "BOX_CLASS_LESIONS",
    "DROPPED_CLASSES",
    "KEPT_CLASSES",
    "VINDR_CXR_CLASSES",
    "AnomalyBoxDetector",
    "YOLOBoxDetector",
    "box_matches_lesion",
    "boxes_from_yolo_result",
    "ellipse_kernel",
    "normalize_class_name",
    "save_tiny_yolo",
]

#: The 14 VinDr-CXR (VinBigData challenge) classes in their class-id order, then "No finding" (id 14).
VINDR_CXR_CLASSES: Final[tuple[str, ...]] = (
    "Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Consolidation", "ILD", "Infiltration",
    "Lung Opacity", "Nodule/Mass", "Other lesion", "Pleural effusion", "Pleural thickening", "Pneumothorax",
    "Pulmonary fibrosis", "No finding",
)

#: VinDr-CXR classes kept by ILS §8 (hyperintense findings), in the spelling of this package.
KEPT_CLASSES: Final[tuple[str, ...]] = (
    "atelectasis", "calcification", "consolidation", "ILD", "infiltration", "lung opacity", "nodule/mass",
    "pleural effusion", "pleural thickening", "pulmonary fibrosis",
)
#: Classes ILS §8 drops explicitly (the detector's other classes are dropped as well).
DROPPED_CLASSES: Final[tuple[str, ...]] = ("aortic enlargement", "other lesion", "pneumothorax")

#: Which ILS lesions a kept class may stand for, used only when ``IlsConfig.box_class_must_match`` is set
#: (the paper lets any kept box count for any lesion). A label not listed here (e.g. the built-in
#: detector's ``anomaly``) matches every lesion.
BOX_CLASS_LESIONS: Final[dict[str, frozenset[str]]] = {
    "atelectasis": frozenset({"atelectasis", "opacity"}),
    "calcification": frozenset({"opacity"}),
    "consolidation": frozenset({"consolidation", "pneumonia", "opacity"}),
    "ILD": frozenset({"edema", "opacity"}),
    "infiltration": frozenset({"pneumonia", "consolidation", "opacity", "edema"}),
    "lung opacity": frozenset({"pneumonia", "consolidation", "opacity", "edema", "atelectasis"}),
    "nodule/mass": frozenset({"opacity"}),
    "pleural effusion": frozenset({"effusion"}),
    "pleural thickening": frozenset({"effusion"}),
    "pulmonary fibrosis": frozenset({"opacity"}),
}

_ALIASES: Final[dict[str, str]] = {
    "ild": "ILD",
    "interstitial lung disease": "ILD",
    "nodule mass": "nodule/mass",
    "nodule/mass": "nodule/mass",
    "nodule or mass": "nodule/mass",
    "lung opacity": "lung opacity",
    "opacity": "lung opacity",
    "effusion": "pleural effusion",
    "pleural effusion": "pleural effusion",
    "pleural thickening": "pleural thickening",
    "pulmonary fibrosis": "pulmonary fibrosis",
    "fibrosis": "pulmonary fibrosis",
    "aortic enlargement": "aortic enlargement",
    "other lesion": "other lesion",
    "other lesions": "other lesion",
    "no finding": "no finding",
}


def normalize_class_name(name: str) -> str:
    """Canonical spelling of a VinDr-CXR class name (see the module docstring)."""
    text = re.sub(r"[_\-]+", " ", str(name)).strip().lower()
    text = re.sub(r"\s*/\s*", "/", text)
    text = re.sub(r"\s+", " ", text)
    return _ALIASES.get(text, text)


def box_matches_lesion(label: str, lesion: str) -> bool:
    """True when a box of class ``label`` may ground ``lesion`` (see :data:`BOX_CLASS_LESIONS`)."""
    lesions = BOX_CLASS_LESIONS.get(normalize_class_name(label))
    return lesions is None or lesion in lesions


def ellipse_kernel(size: int) -> np.ndarray:
    """A ``size × size`` elliptical (disc) structuring element: ``(dx² + dy²) ≤ (size/2)²`` about the centre."""
    if size < 1:
        raise ValueError(f"kernel size must be >= 1, got {size}")
    c = (size - 1) / 2.0
    yy, xx = np.mgrid[0:size, 0:size]
    return ((yy - c) ** 2 + (xx - c) ** 2) <= (size / 2.0) ** 2


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]), int(rows[-1])


# --- built-in detector ------------------------------------------------------------------------------

@dataclass(frozen=True)
class AnomalyBoxDetector:
    """Boxes around connected components (and clusters) of the thresholded anomaly map."""

    levels: tuple[float, ...] = (0.05, 0.10, 0.20)
    """Anomaly levels at which components are taken."""
    opening_kernel: int = 5
    """Elliptical opening of each level mask (pixels at a 512 canvas; scaled with the longest side)."""
    min_area_fraction: float = 0.0005
    """Smallest component, as a share of the image area (same as ILS §9.3's minimum size)."""
    merge_gap: float = 0.03
    """Components closer than this (fraction of the longest side) form a cluster with its own box."""
    strength_mid: float = 0.26
    """Strength factor: logistic in the 90th-percentile anomaly, 0.5 at this value..."""
    strength_width: float = 0.04
    """...with this width (anomaly units)."""
    size_mid: float = 0.003
    """Size factor: logistic in log(area), 0.5 at this share of the image area..."""
    size_width: float = 0.5
    """...with this width (natural-log units)."""
    compactness_power: float = 0.5
    min_confidence: float = 0.2
    """Boxes below this confidence are not emitted (the detector's own output floor)."""
    max_boxes: int = 64
    label: str = "anomaly"

    name = "anomaly"

    def detect(self, image: np.ndarray, anomaly: np.ndarray | None = None) -> list[Box]:
        """Boxes on the canvas, highest confidence first (ties: top-left first)."""
        if anomaly is None:
            raise ConfigError("the anomaly box detector needs the anomaly map (x − x̂)/255; pass anomaly=")
        a = np.asarray(anomaly, dtype=np.float32)
        if a.ndim != 2 or (image is not None and np.asarray(image).shape[:2] != a.shape):
            raise ValueError(f"anomaly map shape {a.shape} does not match the image {np.asarray(image).shape}")
        side = max(a.shape)
        k = max(1, round(self.opening_kernel * side / 512))
        kernel = ellipse_kernel(k)
        min_area = max(1.0, self.min_area_fraction * a.size)
        gap = max(1, round(self.merge_gap * side))
        eight = np.ones((3, 3), dtype=bool)
        best: dict[tuple[int, int, int, int], float] = {}
        for level in sorted(self.levels):
            level_mask = a >= np.float32(level)
            if k > 1:
                level_mask = ndimage.binary_opening(level_mask, structure=kernel)
            labels, n = ndimage.label(level_mask, structure=eight)
            if n == 0:
                continue
            sizes = np.bincount(labels.ravel(), minlength=n + 1)
            keep = [int(i) for i in np.flatnonzero(sizes >= min_area) if i > 0]
            if not keep:
                continue
            objects = ndimage.find_objects(labels)
            groups = [[i] for i in keep]
            if len(keep) > 1:
                kept = np.zeros(n + 1, dtype=bool)
                kept[keep] = True
                grown = ndimage.binary_dilation(kept[labels], structure=eight, iterations=max(1, gap // 2))
                clusters, m = ndimage.label(grown, structure=eight)
                member_of = np.zeros(n + 1, dtype=np.int64)
                member_of[labels[kept[labels]]] = clusters[kept[labels]]
                for c in range(1, m + 1):
                    members = [i for i in keep if member_of[i] == c]
                    if len(members) > 1:
                        groups.append(members)
            for members in groups:
                box, values, area = _group_stats(labels, objects, members, a)
                conf = self._confidence(values, area, box, a.size)
                if conf >= self.min_confidence and conf > best.get(box, -1.0):
                    best[box] = conf
        ordered = sorted(best.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][0], kv[0][3], kv[0][2]))
        return [Box(x0, y0, x1, y1, conf, self.label) for (x0, y0, x1, y1), conf in ordered[: self.max_boxes]]

    def _confidence(self, values: np.ndarray, area: int, box: tuple[int, int, int, int], image_area: int) -> float:
        x0, y0, x1, y1 = box
        fill = area / float((x1 - x0 + 1) * (y1 - y0 + 1))
        a90 = float(np.percentile(values, 90))
        strength = _logistic((a90 - self.strength_mid) / self.strength_width)
        size = _logistic((math.log(max(area, 1)) - math.log(self.size_mid * image_area)) / self.size_width)
        return float(min(1.0, max(0.0, round(strength * size * fill**self.compactness_power, 6))))

    def provenance(self) -> dict[str, Any]:
        """Backend name and settings."""
        settings = asdict(self)
        settings["levels"] = list(self.levels)
        return {"name": self.name, "version": "1", "settings": settings}


def _logistic(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(z, 60.0), -60.0)))


def _group_stats(labels: np.ndarray, objects: list, members: list[int],
                 a: np.ndarray) -> tuple[tuple[int, int, int, int], np.ndarray, int]:
    """Inclusive box ``(x0, y0, x1, y1)``, anomaly values and pixel count of the union of ``members``."""
    y0 = min(objects[i - 1][0].start for i in members)
    y1 = max(objects[i - 1][0].stop for i in members) - 1
    x0 = min(objects[i - 1][1].start for i in members)
    x1 = max(objects[i - 1][1].stop for i in members) - 1
    sub = labels[y0 : y1 + 1, x0 : x1 + 1]
    inside = np.isin(sub, members)
    values = a[y0 : y1 + 1, x0 : x1 + 1][inside]
    return (x0, y0, x1, y1), values, int(values.size)


# --- YOLO adapter ------------------------------------------------------------------------------------

def _to_numpy(value: Any) -> np.ndarray:
    for attr in ("detach", "cpu", "numpy"):
        if hasattr(value, attr) and not isinstance(value, np.ndarray):
            value = getattr(value, attr)()
    return np.asarray(value)


def boxes_from_yolo_result(
    result: Any,
    shape: tuple[int, int],
    kept: Iterable[str] = KEPT_CLASSES,
    names: dict[int, str] | Sequence[str] | None = None,
) -> list[Box]:
    """Convert one ultralytics ``Results`` object to kept :class:`Box` es on a canvas of ``shape``.

    ``result.boxes`` must provide ``xyxy`` (pixel-edge coordinates), ``conf`` and ``cls``; class names come
    from ``names`` or ``result.names``. A box ``[x0, x1)`` in edge coordinates becomes inclusive pixel bounds
    ``floor(x0) .. ceil(x1) − 1``, clipped to the canvas. Classes not in ``kept`` (after
    :func:`normalize_class_name`) are dropped.
    """
    kept_set = {normalize_class_name(k) for k in kept}
    names = names if names is not None else getattr(result, "names", None)
    if names is None:
        raise ConfigError("the YOLO result carries no class names; pass names=")
    lookup = dict(enumerate(names)) if isinstance(names, list | tuple) else dict(names)
    boxes = getattr(result, "boxes", None)
    if boxes is None:
        return []
    xyxy = _to_numpy(boxes.xyxy).reshape(-1, 4).astype(np.float64)
    conf = _to_numpy(boxes.conf).reshape(-1).astype(np.float64)
    cls = _to_numpy(boxes.cls).reshape(-1).astype(np.int64)
    h, w = shape
    out: list[Box] = []
    for (bx0, by0, bx1, by1), c, k in zip(xyxy, conf, cls, strict=True):
        label = normalize_class_name(lookup.get(int(k), str(k)))
        if label not in kept_set:
            continue
        x0 = min(max(math.floor(bx0), 0), w - 1)
        y0 = min(max(math.floor(by0), 0), h - 1)
        x1 = min(max(math.ceil(bx1) - 1, x0), w - 1)
        y1 = min(max(math.ceil(by1) - 1, y0), h - 1)
        out.append(Box(int(x0), int(y0), int(x1), int(y1), float(min(max(c, 0.0), 1.0)), label))
    out.sort(key=lambda b: (-b.confidence, b.y0, b.x0, b.y1, b.x1, b.label))
    return out


class YOLOBoxDetector:
    """An ultralytics YOLO checkpoint trained on VinDr-CXR (e.g. a VinBigData competition solution).

    ``weights_path`` is a local ``.pt`` file. Prediction runs on the grey canvas replicated to three
    channels at ``imgsz`` (default: the training size recorded in the ``.json`` sidecar that ``cxrground detector
    train`` writes next to the weights, else 1024) with a low confidence floor (``predict_conf``) and NMS IoU
    ``iou``, so that Algorithm 1 applies τ_conf itself. Only :data:`KEPT_CLASSES` survive. ``device`` goes to
    ultralytics (``cpu``, ``cuda``, ``0``...; default: its own choice); ``dtype`` is ``float32`` or ``float16``
    (ultralytics' ``half``; it has no bfloat16 inference). Options may be strings (``--detector-opt imgsz=640``).
    ``ultralytics`` (the ``yolo`` extra) is imported on first use, offline
    (:func:`~cxrground.ils.detector.needs.ultralytics_offline`); a missing package or file is a
    :class:`~cxrground.errors.ConfigError` saying what to do.
    """

    name = "yolo"

    def __init__(
        self,
        weights_path: str | Path,
        imgsz: int | str | None = None,
        predict_conf: float | str = 0.01,
        iou: float | str = 0.5,
        device: str | None = None,
        kept: Sequence[str] = KEPT_CLASSES,
        model: Any = None,
        dtype: str = "float32",
    ) -> None:
        self.weights_path = Path(weights_path)
        try:
            self.imgsz = int(imgsz) if imgsz is not None else _trained_size(self.weights_path)
            self.predict_conf = float(predict_conf)
            self.iou = float(iou)
        except ValueError as exc:
            raise ConfigError(f"YOLO imgsz must be an integer, predict_conf and iou numbers: {exc}") from None
        if dtype not in ("float32", "float16"):
            raise ConfigError(f"YOLO dtype must be float32 or float16 (ultralytics' half), got {dtype!r}")
        self.dtype = dtype
        self.device = device
        self.kept = tuple(kept)
        self._model = model
        if model is None and not self.weights_path.is_file():
            raise ConfigError(
                f"YOLO weights not found at {self.weights_path}: download a VinDr-CXR-trained ultralytics "
                "checkpoint (a .pt file, e.g. from a VinBigData chest X-ray competition solution) and pass its "
                "local path (detector_kwargs weights_path=...)"
            )
        self._sha256: str | None = None

    def _load(self) -> Any:
        if self._model is None:
            from cxrground.ils.detector.needs import ultralytics_offline

            try:
                ultralytics_offline()  # before ultralytics is imported: no network look-up, no telemetry
                from ultralytics import YOLO
            except ImportError as exc:
                raise ConfigError(
                    "the YOLO detector needs the 'ultralytics' package: pip install ultralytics "
                    f"(or 'cxrground[yolo]'; it needs torchvision; weights: {self.weights_path})"
                ) from exc
            self._model = YOLO(str(self.weights_path))
        return self._model

    def check_ready(self) -> None:
        """Load the model now: a missing ``ultralytics`` package or weights it cannot read is a
        :class:`~cxrground.errors.ConfigError` (a build asks before its first study)."""
        try:
            self._load()
        except ConfigError:
            raise
        except Exception as exc:  # whatever ultralytics raises for a file that is no checkpoint
            raise ConfigError(f"YOLO weights {self.weights_path} could not be loaded ({type(exc).__name__}: "
                              f"{exc})") from exc

    def detect(self, image: np.ndarray, anomaly: np.ndarray | None = None) -> list[Box]:
        """Kept boxes on the canvas (``anomaly`` is not used)."""
        x = np.asarray(image)
        if x.ndim != 2:
            raise ValueError(f"image must be a 2-D grey canvas, got shape {x.shape}")
        model = self._load()
        rgb = np.repeat(x.astype(np.uint8)[:, :, None], 3, axis=2)
        kwargs: dict[str, Any] = {"imgsz": self.imgsz, "conf": self.predict_conf, "iou": self.iou, "verbose": False}
        if self.device is not None:
            kwargs["device"] = self.device
        if self.dtype == "float16":
            kwargs["half"] = True
        results = model.predict(rgb, **kwargs)
        if not results:
            return []
        return boxes_from_yolo_result(results[0], x.shape, self.kept, getattr(model, "names", None))

    def provenance(self) -> dict[str, Any]:
        """Backend name, weights path and sha256, settings."""
        if self._sha256 is None and self.weights_path.is_file():
            self._sha256 = sha256_file(self.weights_path)
        return {
            "name": self.name,
            "weights_path": str(self.weights_path.absolute()),
            "weights_sha256": self._sha256,
            "settings": {"imgsz": self.imgsz, "predict_conf": self.predict_conf, "iou": self.iou,
                         "device": self.device, "dtype": self.dtype, "kept": list(self.kept)},
        }


def _trained_size(weights: Path) -> int:
    """The training image size of the sidecar ``weights.json`` written by ``cxrground detector train``, else 1024."""
    sidecar = weights.with_suffix(".json")
    try:
        return int(json.loads(sidecar.read_text())["training"]["imgsz"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1024


def save_tiny_yolo(path: str | Path, model_yaml: str = "yolov8n.yaml") -> Path:
    """Save a random YOLO detector built from an ultralytics model yaml with the VinDr-CXR class names (a ``.pt``).

    The architecture is the yaml's (default YOLOv8-n, about 3 M parameters) with a 15-class head; for tests and
    smoke checks (its boxes are noise). Needs ``ultralytics``.
    """
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    yolo = YOLO(model_yaml)
    yolo.model = DetectionModel(model_yaml, nc=len(VINDR_CXR_CLASSES), verbose=False)
    yolo.model.names = dict(enumerate(VINDR_CXR_CLASSES))
    yolo.save(str(out))
    return out
