"""Adapters to external lung/heart segmenters: CXAS and CheXmask's HybridGNet (the ILS reference, §8).

Neither model is shipped or downloaded (no network access, ever): the user puts the weights on disk, and a
missing piece raises :class:`~cxrground.errors.ConfigError` saying what to download and where to put it. Both
networks are implemented here in plain torch with the parameter names of their released weights, so only torch
(the ``models`` extra) is needed:

- :class:`HybridGNetSegmenter`: a HybridGNet (Gaggion et al., CheXmask) predicts 120 landmarks on a
  1024² letterboxed image: right lung 0–43, left lung 44–93, heart 94–119 (``x, y`` per point). The
  landmark → mask decoding (:func:`decode_landmarks`: polygons filled at native size) is shared by every
  checkpoint form; the released state dict (``bestMSE.pt``) loads into
  :class:`~cxrground.anatomy.segment.hybridgnet_net.HybridGNet`.
- :class:`CXASSegmenter`: the CXAS network (Seibold et al., 159 anatomy classes;
  :class:`~cxrground.anatomy.segment.cxas_net.CXASUNet`), its ``right lung``, ``left lung`` and ``heart``
  classes. The ``cxas`` package itself is not needed (it pins ``pydicom<3`` and needs torchvision); a
  ``predictor`` callable can stand in for the network.

Both take ``device`` (``cuda``, ``cuda:1``, ``cpu``; default ``cuda`` when available) and ``dtype`` (``float32``,
``bfloat16``, ``float16``; default ``float32``); options may be strings (``--segmenter-opt dtype=bfloat16``).
"""

from __future__ import annotations

import threading
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw

from cxrground.anatomy.segment.base import LungHeartMasks
from cxrground.errors import ConfigError, InputError
from cxrground.extras import missing_extra
from cxrground.io.image import CXRImage
from cxrground.io.masks import as_mask
from cxrground.io.transform import Letterbox
from cxrground.registry import strict_bool

__all__ = [
    "CXAS_CLASSES",
    "DTYPES",
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
#: Floating-point types a network may run in (``dtype=`` option).
DTYPES: Final[tuple[str, ...]] = ("float32", "bfloat16", "float16")


def _flag(value: bool | str) -> bool:
    """A boolean option given as a bool or a command-line string (true/false, 1/0, yes/no)."""
    return strict_bool("", value)


def _device_dtype(backend: str, device: str | None, dtype: str) -> tuple[str | None, str]:
    if dtype not in DTYPES:
        raise ConfigError(f"{backend} dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return (str(device) if device else None), dtype


def _torch_device(device: str | None) -> Any:
    import torch

    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


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

    - the released state dict (CheXmask's ``Weights/SegmentationModel/bestMSE.pt``, ``torch.save`` of
      ``Hybrid.state_dict()``): loaded into :class:`~cxrground.anatomy.segment.hybridgnet_net.HybridGNet`, sized
      from the weights (its input side then replaces ``input_size``); its output is normalised to [0, 1];
    - a ``torch.export`` archive (``.pt2``, ``torch.export.save``): loaded with ``torch.export.load``;
    - a TorchScript file (``torch.jit.save`` of the model): loaded with ``torch.jit.load``;
    - a pickled full model object (``torch.save(model)``): refused unless ``allow_pickle=True``, since
      unpickling runs code from the file; then loaded with ``torch.load(path, weights_only=False)`` and
      checked to be a ``torch.nn.Module``.

    Pre-processing follows CheXmask's inference: grey image letterboxed (centred) to ``input_size``² and
    scaled to [0, 1]. A ``torch.nn.Module`` network runs on ``device`` in ``dtype``.
    """

    name = "hybridgnet"

    def __init__(
        self,
        weights_path: str | Path | None = None,
        *,
        model: Callable[[Any], Any] | None = None,
        allow_pickle: bool | str = False,
        input_size: int | str = HYBRIDGNET_INPUT_SIZE,
        device: str | None = None,
        dtype: str = "float32",
    ) -> None:
        self.weights_path = Path(weights_path) if weights_path is not None else None
        self.allow_pickle = _flag(allow_pickle)
        try:
            self.input_size = int(input_size)
        except ValueError:
            raise ConfigError(f"HybridGNet input_size must be an integer, got {input_size!r}") from None
        self.device, self.dtype = _device_dtype("HybridGNet", device, dtype)
        self._model = model
        self._kind = "object" if model is not None else None
        self._lock = threading.Lock()
        if model is None:
            self._check_path()

    def _check_path(self) -> Path:
        if self.weights_path is None:
            raise ConfigError(
                "HybridGNet needs weights_path= (the released state dict bestMSE.pt, or an exported model) or "
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
            raise missing_extra(exc, "HybridGNet") from exc
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
        obj, pickled = _torch_load(path, self.allow_pickle, "a pickled model object", "allow_pickle=True only for a "
                                   "checkpoint you trust, or export it (torch.export .pt2 or TorchScript)")
        if pickled:
            if not isinstance(obj, torch.nn.Module):
                raise ConfigError(f"{path}: unpickled a {type(obj).__name__}, expected a torch.nn.Module")
            self._kind = "pickled-module"
            obj.eval()
            return obj
        if isinstance(obj, Mapping):
            return self._from_state_dict(path, obj)
        raise ConfigError(f"{path}: unexpected checkpoint content {type(obj).__name__}")

    def _from_state_dict(self, path: Path, state: Mapping[str, Any]) -> Callable[[Any], Any]:
        from cxrground.anatomy.segment.hybridgnet_net import HybridGNet

        try:
            net = HybridGNet.from_state_dict(state)
        except (KeyError, ValueError, RuntimeError) as exc:
            keys = list(state)[:5]
            raise ConfigError(
                f"{path} is a state dict (keys {keys}...) but not of the CheXmask lungs + heart HybridGNet "
                f"({type(exc).__name__}: {str(exc)[:300]}); pass the released bestMSE.pt, or model=..., or an "
                "exported model (torch.export .pt2 or TorchScript)"
            ) from exc
        self._kind = "state-dict"
        self.input_size = net.config.input_size
        return net

    def _ensure(self) -> Callable[[Any], Any]:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    model = self._load()
                    import torch

                    if isinstance(model, torch.nn.Module):
                        model = model.to(_torch_device(self.device), getattr(torch, self.dtype))
                    self._model = model
        return self._model

    def predict_landmarks(self, image: CXRImage) -> tuple[np.ndarray, Letterbox]:
        """The model's 120 landmarks in canvas pixels, and the letterbox record."""
        import torch

        model = self._ensure()
        box = Letterbox.fit(image.shape, self.input_size)
        canvas = box.image_to_canvas(image.pixels).astype(np.float32) / 255.0
        x = torch.from_numpy(canvas)[None, None]
        if isinstance(model, torch.nn.Module):
            ref = next(iter(model.parameters()), None)
            if ref is None:
                ref = next(iter(model.buffers()), None)
            if ref is not None:
                x = x.to(ref.device, ref.dtype if ref.is_floating_point() else torch.float32)
        with torch.inference_mode():
            out = model(x)
        if isinstance(out, tuple | list):
            out = out[0]
        if hasattr(out, "detach"):
            out = out.detach().float().cpu().numpy()
        pts = np.asarray(out, dtype=np.float64).reshape(-1, 2)
        if pts.shape[0] != N_LANDMARKS:
            raise InputError(f"HybridGNet returned {pts.shape[0]} landmarks, expected {N_LANDMARKS}", image.path)
        # the released network is normalised to [0, 1] (CheXmask multiplies by the input size); other forms are
        # read as normalised when every value is within 1.5
        if self._kind == "state-dict" or np.nanmax(np.abs(pts)) <= 1.5:
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
            "device": self.device,
            "dtype": self.dtype,
            "letterbox": "fit-center",
            "landmarks": {k: [s.start, s.stop - 1] for k, s in HYBRIDGNET_SLICES.items()},
        }


def _torch_load(path: Path, allow_pickle: bool, what: str, advice: str) -> tuple[Any, bool]:
    """``(object, unpickled)`` of a torch file: weights-only first; a file holding ``what`` (pickled classes) is
    loaded in full only when ``allow_pickle``, else refused with ``advice``; any other failure is a ConfigError."""
    import torch

    try:
        return torch.load(str(path), map_location="cpu", weights_only=True), False
    except Exception as exc:  # weights_only refuses pickled classes, or the file is not a torch file
        if not _looks_like_pickled_object(exc):
            raise ConfigError(f"{path}: not a readable torch checkpoint ({exc})") from exc
        if not allow_pickle:
            raise ConfigError(f"{path} holds {what}; loading it runs code from the file. Pass {advice}") from exc
    try:
        return torch.load(str(path), map_location="cpu", weights_only=False), True
    except Exception as exc:
        raise ConfigError(f"{path}: not a readable torch checkpoint ({exc})") from exc


def _looks_like_pickled_object(exc: Exception) -> bool:
    import pickle

    # torch's weights-only unpickler names the class it refused ("Unsupported global: GLOBAL module.Class");
    # a file that is not a pickle at all fails with "invalid load key" instead
    return isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in str(exc)


# --- CXAS ---------------------------------------------------------------------------------------------

CXASPredictor = Callable[[np.ndarray], Mapping[str, np.ndarray]]


class CXASSegmenter:
    """CXAS right lung, left lung and heart classes at native size.

    ``weights_dir`` must hold ``<model_name>.pth``: the checkpoint the cxas package fetches into
    ``~/.cxas/weights/`` on a machine with internet (``{"model": state_dict}``; this project never downloads).
    It is loaded into :class:`~cxrground.anatomy.segment.cxas_net.CXASUNet` (sized from the weights) and run as
    the package's ``CXAS.process_file`` does; ``allow_pickle=True`` reads a checkpoint holding other pickled
    objects (it runs code from the file). ``predictor`` replaces the network: a callable taking the grey
    ``(H, W)`` uint8 pixels and returning a mapping from CXAS class names (at least ``right lung``, ``left lung``,
    ``heart``) to masks of any size (resized to native by nearest neighbour).
    """

    name = "cxas"

    def __init__(
        self,
        weights_dir: str | Path | None = None,
        model_name: str = "UNet_ResNet50_default",
        predictor: CXASPredictor | None = None,
        device: str | None = None,
        dtype: str = "float32",
        allow_pickle: bool | str = False,
    ) -> None:
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.model_name = model_name
        self.device, self.dtype = _device_dtype("CXAS", device, dtype)
        self.allow_pickle = _flag(allow_pickle)
        self._predictor = predictor
        self._ignored_keys: list[str] | None = None
        self._lock = threading.Lock()
        if predictor is None:
            self._check()

    def _check(self) -> Path:
        if self.weights_dir is None:
            raise ConfigError(f"CXAS needs weights_dir=, a folder holding {self.model_name}.pth (see {CXAS_SOURCE})")
        weights = self.weights_dir / f"{self.model_name}.pth"
        if not weights.is_file():
            raise ConfigError(
                f"CXAS weights not found at {weights}: on a machine with internet, let the cxas package download "
                f"'{self.model_name}' (it saves ~/.cxas/weights/{self.model_name}.pth; or take it from {CXAS_SOURCE}) "
                f"and copy the .pth file to {self.weights_dir}/"
            )
        return weights

    def _ensure(self) -> CXASPredictor:
        if self._predictor is None:
            with self._lock:
                if self._predictor is None:
                    self._predictor = self._network_predictor()
        return self._predictor

    def _read_checkpoint(self, weights: Path) -> Any:
        return _torch_load(weights, self.allow_pickle, "pickled objects besides the weights",
                           "allow_pickle=true only for a checkpoint you trust")[0]

    def _network_predictor(self) -> CXASPredictor:
        weights = self._check()
        try:
            import torch

            from cxrground.anatomy.segment.cxas_net import CXAS_LABEL_IDS, CXASUNet, checkpoint_state
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise missing_extra(exc, "CXAS") from exc
        try:
            net, ignored = CXASUNet.from_state_dict(checkpoint_state(self._read_checkpoint(weights)))
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{weights} is not a CXAS U-Net checkpoint ({type(exc).__name__}: "
                              f"{str(exc)[:300]})") from exc
        self._ignored_keys = ignored
        net = net.to(_torch_device(self.device), getattr(torch, self.dtype))

        def predict(pixels: np.ndarray) -> Mapping[str, np.ndarray]:
            masks = net.predict(torch.from_numpy(np.array(pixels, dtype=np.uint8)))
            return {name: masks[i].cpu().numpy() for name, i in CXAS_LABEL_IDS.items()}

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
        """Backend, model name, weights path and sha256, device and dtype."""
        from cxrground.io.files import sha256_file

        weights = self.weights_dir / f"{self.model_name}.pth" if self.weights_dir else None
        return {
            "backend": self.name,
            "model_name": self.model_name,
            "weights": str(weights) if weights else None,
            "weights_sha256": sha256_file(weights) if weights and weights.is_file() else None,
            "classes": dict(CXAS_CLASSES),
            "predictor": "injected" if self._predictor is not None and self.weights_dir is None else "network",
            "ignored_checkpoint_keys": self._ignored_keys,
            "device": self.device,
            "dtype": self.dtype,
        }
