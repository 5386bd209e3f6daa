"""Adapters to external lung/heart segmenters: CXAS and CheXmask's HybridGNet (the ILS reference, §8).

Neither model is shipped or downloaded (no network access, ever): the user installs the package and/or
puts the weights on disk, and a missing piece raises :class:`~cxrground.errors.ConfigError` saying what
to install or download and where to put it.

- :class:`HybridGNetSegmenter`: a HybridGNet (Gaggion et al., CheXmask) predicts 120 landmarks on a
  1024² letterboxed image: right lung 0–43, left lung 44–93, heart 94–119 (``x, y`` per point). The
  landmark → mask decoding (:func:`decode_landmarks`: polygons filled at native size) is complete and
  tested; the network comes from the user (see the class docstring for the accepted checkpoint forms).
- :class:`CXASSegmenter`: the ``cxas`` package (Seibold et al., 159 anatomy classes); its ``right lung``,
  ``left lung`` and ``heart`` classes. The package is not installed in this project's test environment,
  so the call into it follows the package's documented interface and is untested against it; a
  ``predictor`` callable can stand in for it.
"""

from __future__ import annotations

import importlib.util
import threading
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw

from cxrground.anatomy.segment.base import LungHeartMasks
from cxrground.errors import ConfigError, InputError
from cxrground.io.image import CXRImage
from cxrground.io.masks import as_mask
from cxrground.io.transform import Letterbox

__all__ = [
    "CXAS_CLASSES",
    "HYBRIDGNET_INPUT_SIZE",
    "HYBRIDGNET_SLICES",
    "N_LANDMARKS",
    "CXASSegmenter",
    "HybridGNetSegmenter",
    "decode_landmarks",
    "fill_polygon",
]

#: HybridGNet landmark layout (CheXmask): right lung 0–43 (44), left lung 44–93 (50), heart 94–119 (26).
HYBRIDGNET_SLICES: Final[dict[str, slice]] = {
    "right_lung": slice(0, 44),
    "left_lung": slice(44, 94),
    "heart": slice(94, 120),
}
N_LANDMARKS: Final[int] = 120
HYBRIDGNET_INPUT_SIZE: Final[int] = 1024
HYBRIDGNET_SOURCE: Final[str] = "https://github.com/ngaggion/CheXmask-Database (HybridGNet weights and code)"
#: CXAS class names used for the three structures.
CXAS_CLASSES: Final[dict[str, str]] = {"right_lung": "right lung", "left_lung": "left lung", "heart": "heart"}
CXAS_SOURCE: Final[str] = "https://github.com/ConstantinSeibold/ChestXRayAnatomySegmentation"


# --- landmarks -> masks -----------------------------------------------------------------------------

def fill_polygon(points_xy: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Filled polygon (outline included) of ``[x, y]`` vertices, pixel centres at integers; bool ``shape``."""
    pts = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
    h, w = int(shape[0]), int(shape[1])
    canvas = Image.new("1", (w, h), 0)
    if len(pts) >= 3 and np.isfinite(pts).all():
        ImageDraw.Draw(canvas).polygon([(float(x), float(y)) for x, y in pts], fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


def decode_landmarks(
    landmarks: np.ndarray,
    shape: tuple[int, int],
    letterbox: Letterbox | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HybridGNet's 120 ``[x, y]`` landmarks → (right lung, left lung, heart) masks at native ``shape``.

    With ``letterbox`` the landmarks are in its canvas pixels and are mapped to native pixels first
    (:meth:`Letterbox.points_to_native`); without, they are native pixels. Each structure's points are
    its outline in order and are filled as one polygon. The lungs are made exclusive of each other (a
    pixel inside both outlines stays with the right lung); the heart may overlap them, as the heart
    shadow overlaps the lungs on a radiograph.
    """
    pts = np.asarray(landmarks, dtype=np.float64)
    if pts.size != 2 * N_LANDMARKS:
        raise InputError(f"HybridGNet output must hold {N_LANDMARKS} (x, y) landmarks, got shape {pts.shape}")
    pts = pts.reshape(N_LANDMARKS, 2)
    if not np.isfinite(pts).all():
        raise InputError("HybridGNet landmarks contain NaN or infinite values")
    if letterbox is not None:
        if tuple(letterbox.src_hw) != tuple(int(v) for v in shape):
            raise InputError(f"letterbox is for an image of shape {letterbox.src_hw}, not {tuple(shape)}")
        pts = letterbox.points_to_native(pts)
    right = fill_polygon(pts[HYBRIDGNET_SLICES["right_lung"]], shape)
    left = fill_polygon(pts[HYBRIDGNET_SLICES["left_lung"]], shape) & ~right
    heart = fill_polygon(pts[HYBRIDGNET_SLICES["heart"]], shape)
    return right, left, heart


# --- HybridGNet ---------------------------------------------------------------------------------------

def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any("/code/" in n or n.startswith("code/") for n in zf.namelist())


class HybridGNetSegmenter:
    """CheXmask HybridGNet behind :class:`LungHeartSegmenter` (lungs and heart from the model).

    The network: pass ``model=`` (any callable taking a ``(1, 1, S, S)`` float tensor in [0, 1] and
    returning landmarks ``(1, 120, 2)`` or a tuple/list whose first item is that, in canvas pixels or
    normalised to [0, 1]), or ``weights_path=`` to one of:

    - a ``torch.export`` archive (``.pt2``, ``torch.export.save``): loaded with ``torch.export.load``;
    - a TorchScript file (``torch.jit.save`` of the model): loaded with ``torch.jit.load``;
    - a pickled full model object (``torch.save(model)``): refused unless ``allow_pickle=True``, since
      unpickling runs code from the file; then loaded with ``torch.load(path, weights_only=False)`` and
      checked to be a ``torch.nn.Module``.

    A plain state dict is refused with a :class:`ConfigError`: the HybridGNet architecture (CheXmask's
    ``models/HybridGNet2IGSC.py``: ``Hybrid(config, D_t, U_t, A_t)``, graph convolutions over the 120-node
    lungs+heart graph, encoder channels in ``config``) is not part of cxrground. Build it with the CheXmask
    code, ``load_state_dict`` the file, and pass ``model=``, or export it (``torch.export`` / TorchScript).

    Pre-processing follows CheXmask's inference: grey image letterboxed (centred) to ``input_size``² and
    scaled to [0, 1].
    """

    name = "hybridgnet"

    def __init__(
        self,
        weights_path: str | Path | None = None,
        *,
        model: Callable[[Any], Any] | None = None,
        allow_pickle: bool = False,
        input_size: int = HYBRIDGNET_INPUT_SIZE,
    ) -> None:
        self.weights_path = Path(weights_path) if weights_path is not None else None
        self.allow_pickle = allow_pickle
        self.input_size = int(input_size)
        self._model = model
        self._kind = "object" if model is not None else None
        self._lock = threading.Lock()
        if model is None:
            self._check_path()

    def _check_path(self) -> Path:
        if self.weights_path is None:
            raise ConfigError(
                "HybridGNet needs weights_path= (a TorchScript or pickled HybridGNet checkpoint on disk) or "
                f"model=; get the weights and code from {HYBRIDGNET_SOURCE}; cxrground never downloads them"
            )
        if not self.weights_path.is_file():
            raise ConfigError(
                f"HybridGNet checkpoint not found at {self.weights_path}: download the CheXmask HybridGNet "
                f"weights from {HYBRIDGNET_SOURCE} on a machine with internet and put the file at that path"
            )
        return self.weights_path

    def _load(self) -> Callable[[Any], Any]:
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError(f"HybridGNet needs torch ({exc}); pip install 'cxrground[models]'") from exc
        path = self._check_path()
        if path.suffix == ".pt2":
            self._kind = "torch.export"
            try:
                return torch.export.load(str(path)).module()
            except Exception as exc:
                raise ConfigError(f"{path}: not a loadable torch.export archive ({exc})") from exc
        if _is_torchscript(path):
            self._kind = "torchscript"
            model = torch.jit.load(str(path), map_location="cpu")
            model.eval()
            return model
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # weights_only refuses pickled classes, or the file is not a torch file
            if not _looks_like_pickled_object(exc):
                raise ConfigError(f"{path}: not a readable torch checkpoint ({exc})") from exc
            if not self.allow_pickle:
                raise ConfigError(
                    f"{path} holds a pickled model object; loading it runs code from the file. Pass "
                    "allow_pickle=True only for a checkpoint you trust, or export it (torch.export .pt2 or TorchScript)"
                ) from exc
            obj = torch.load(str(path), map_location="cpu", weights_only=False)
            if not isinstance(obj, torch.nn.Module):
                raise ConfigError(f"{path}: unpickled a {type(obj).__name__}, expected a torch.nn.Module") from exc
            self._kind = "pickled-module"
            obj.eval()
            return obj
        if isinstance(obj, Mapping):
            keys = list(obj)[:5]
            raise ConfigError(
                f"{path} is a state dict (keys {keys}...), not a model: the HybridGNet architecture is not part "
                "of cxrground. Build CheXmask's Hybrid model (models/HybridGNet2IGSC.py), load_state_dict this "
                "file and pass model=..., or export it (torch.export.save to a .pt2, or TorchScript) and pass that file"
            )
        raise ConfigError(f"{path}: unexpected checkpoint content {type(obj).__name__}")

    def _ensure(self) -> Callable[[Any], Any]:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def predict_landmarks(self, image: CXRImage) -> tuple[np.ndarray, Letterbox]:
        """The model's 120 landmarks in canvas pixels, and the letterbox record."""
        import torch

        model = self._ensure()
        box = Letterbox.fit(image.shape, self.input_size)
        canvas = box.image_to_canvas(image.pixels).astype(np.float32) / 255.0
        with torch.inference_mode():
            out = model(torch.from_numpy(canvas)[None, None])
        if isinstance(out, tuple | list):
            out = out[0]
        pts = np.asarray(out.detach().cpu().numpy() if hasattr(out, "detach") else out, dtype=np.float64)
        pts = pts.reshape(-1, 2)
        if pts.shape[0] != N_LANDMARKS:
            raise InputError(f"HybridGNet returned {pts.shape[0]} landmarks, expected {N_LANDMARKS}", image.path)
        if np.nanmax(np.abs(pts)) <= 1.5:  # normalised output (CheXmask multiplies by the input size)
            pts = pts * self.input_size
        return pts, box

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """Lungs and heart from the landmarks, polygon-filled at native size."""
        pts, box = self.predict_landmarks(image)
        right, left, heart = decode_landmarks(pts, image.shape, box)
        extra = {"letterbox": box.to_dict(), "landmarks_canvas": pts.round(2).tolist()}
        return LungHeartMasks(right, left, heart if heart.any() else None, "model" if heart.any() else "none",
                              self.name, extra)

    def provenance(self) -> dict[str, Any]:
        """Backend, checkpoint path and sha256, input size."""
        from cxrground.io.files import sha256_file

        path = self.weights_path
        return {
            "backend": self.name,
            "weights": str(path) if path else None,
            "weights_sha256": sha256_file(path) if path and path.is_file() else None,
            "checkpoint_kind": self._kind,
            "input_size": self.input_size,
            "letterbox": "fit-center",
            "landmarks": {k: [s.start, s.stop - 1] for k, s in HYBRIDGNET_SLICES.items()},
        }


def _looks_like_pickled_object(exc: Exception) -> bool:
    import pickle

    # torch's weights-only unpickler names the class it refused ("Unsupported global: GLOBAL module.Class");
    # a file that is not a pickle at all fails with "invalid load key" instead
    return isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in str(exc)


# --- CXAS ---------------------------------------------------------------------------------------------

CXASPredictor = Callable[[np.ndarray], Mapping[str, np.ndarray]]


class CXASSegmenter:
    """CXAS (``pip install cxas``) right lung, left lung and heart classes at native size.

    ``weights_dir`` must hold ``<model_name>.pth`` (the file the cxas package fetches on a machine with
    internet; this project never downloads). ``predictor`` replaces the package: a callable taking the
    grey ``(H, W)`` uint8 pixels and returning a mapping from CXAS class names (at least ``right lung``,
    ``left lung``, ``heart``) to masks of any size (resized to native by nearest neighbour).
    """

    name = "cxas"

    def __init__(
        self,
        weights_dir: str | Path | None = None,
        model_name: str = "UNet_ResNet50_default",
        predictor: CXASPredictor | None = None,
    ) -> None:
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.model_name = model_name
        self._predictor = predictor
        self._lock = threading.Lock()
        if predictor is None:
            self._check()

    def _check(self) -> Path:
        if importlib.util.find_spec("cxas") is None:
            raise ConfigError(
                f"the CXAS backend needs the 'cxas' package, which is not installed: pip install cxas "
                f"(see {CXAS_SOURCE}), then download its '{self.model_name}' weights"
            )
        if self.weights_dir is None:
            raise ConfigError(f"CXAS needs weights_dir=, a folder holding {self.model_name}.pth")
        weights = self.weights_dir / f"{self.model_name}.pth"
        if not weights.is_file():
            raise ConfigError(
                f"CXAS weights not found at {weights}: on a machine with internet, let the cxas package download "
                f"'{self.model_name}' (or take it from {CXAS_SOURCE}) and copy the .pth file to {self.weights_dir}/"
            )
        return weights

    def _ensure(self) -> CXASPredictor:
        if self._predictor is None:
            with self._lock:
                if self._predictor is None:
                    self._predictor = self._package_predictor()
        return self._predictor

    def _package_predictor(self) -> CXASPredictor:  # pragma: no cover - needs the cxas package
        weights = self._check()
        try:
            import torch
            from cxas import CXAS
            from cxas.label_mapper import id2label_dict
        except ImportError as exc:
            raise ConfigError(f"the cxas package could not be imported ({exc}); pip install cxas") from exc
        model = CXAS(model_name=self.model_name, gpus="cpu")
        net = getattr(model, "model", None)
        if isinstance(net, torch.nn.Module):
            state = torch.load(str(weights), map_location="cpu", weights_only=True)
            net.load_state_dict(state.get("model", state) if isinstance(state, Mapping) else state)
        names = {int(k): str(v) for k, v in id2label_dict.items()}

        def predict(pixels: np.ndarray) -> Mapping[str, np.ndarray]:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "image.png"
                Image.fromarray(pixels).save(src)
                out = model.process_file(filename=str(src), do_store=False)
            preds = np.asarray(out["segmentation_preds"][0] if isinstance(out, Mapping) else out)
            return {names[i]: preds[i] > 0.5 for i in range(min(len(names), preds.shape[0]))}

        return predict

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """The three CXAS classes at native size (nearest-neighbour resize when needed)."""
        got = self._ensure()(image.pixels)
        masks = {}
        for key, cls_name in CXAS_CLASSES.items():
            if cls_name not in got:
                raise InputError(f"CXAS output has no '{cls_name}' class (got {sorted(got)[:8]}...)", image.path)
            m = as_mask(np.asarray(got[cls_name]).astype(bool), f"CXAS {cls_name} mask")
            if m.shape != image.shape:
                m = np.asarray(Image.fromarray(m).resize((image.width, image.height), Image.Resampling.NEAREST))
            masks[key] = m
        left = masks["left_lung"] & ~masks["right_lung"]
        heart = masks["heart"] if masks["heart"].any() else None
        return LungHeartMasks(masks["right_lung"], left, heart, "model" if heart is not None else "none", self.name,
                              {"model_name": self.model_name})

    def provenance(self) -> dict[str, Any]:
        """Backend, model name, weights path and sha256."""
        from cxrground.io.files import sha256_file

        weights = self.weights_dir / f"{self.model_name}.pth" if self.weights_dir else None
        return {
            "backend": self.name,
            "model_name": self.model_name,
            "weights": str(weights) if weights else None,
            "weights_sha256": sha256_file(weights) if weights and weights.is_file() else None,
            "classes": dict(CXAS_CLASSES),
            "predictor": "injected" if self._predictor is not None and self.weights_dir is None else "cxas package",
        }
