"""Chest X-ray images: one :class:`CXRImage` from PNG, JPEG or DICOM, and batch reading.

Pixels are always display-ready 8-bit grey ``(H, W)`` at the file's native resolution, with
white = dense (MONOCHROME2 convention). DICOM conversion: modality LUT (rescale), then the VOI
LUT or the first window of the file (or an explicit window, or the full data range), then
MONOCHROME1 inversion. The original bit depth, photometric interpretation, pixel spacing and
view are kept on the record.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm.auto import tqdm

from cxrground.errors import Failure, ImageReadError, InputError

__all__ = [
    "IMAGE_SUFFIXES",
    "CXRImage",
    "Window",
    "is_dicom",
    "read_image",
    "read_image_bytes",
    "read_images",
    "to_uint8",
    "write_image",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".dcm", ".dicom")

#: ``"auto"`` = the file's VOI LUT / first window, else the data range; ``"minmax"`` = data range;
#: ``(center, width)`` = that window.
Window = Literal["auto", "minmax"] | tuple[float, float]


@dataclass(frozen=True, eq=False)
class CXRImage:
    """A frontal chest X-ray as 8-bit grey pixels at native resolution, with its provenance."""

    pixels: np.ndarray
    path: str | None = None
    source_format: str = "array"
    spacing: tuple[float, float] | None = None
    """Pixel spacing (row, column) in mm, when the file states it."""
    view: str | None = None
    """View position (``PA``, ``AP``, ``LL`` ...), when known."""
    orientation: tuple[str, str] | None = None
    """DICOM PatientOrientation (row direction, column direction), when known."""
    bits_stored: int = 8
    photometric: str = "MONOCHROME2"
    """Photometric interpretation of the source (pixels here are always MONOCHROME2)."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        px = self.pixels
        if px.ndim != 2 or px.dtype != np.uint8:
            raise ImageReadError(f"pixels must be a 2-D uint8 array, got {px.dtype} {px.shape}", self.path)
        if px.shape[0] == 0 or px.shape[1] == 0:
            raise ImageReadError(f"image has an empty dimension {px.shape}", self.path)

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)``."""
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        """Rows."""
        return self.shape[0]

    @property
    def width(self) -> int:
        """Columns."""
        return self.shape[1]

    def rgb(self) -> np.ndarray:
        """The pixels stacked to ``(H, W, 3)`` uint8."""
        return np.repeat(self.pixels[:, :, None], 3, axis=2)


def is_dicom(path: str | Path) -> bool:
    """True when the file has a DICOM suffix or the ``DICM`` preamble marker."""
    path = Path(path)
    if path.suffix.lower() in (".dcm", ".dicom"):
        return True
    try:
        with path.open("rb") as fh:
            head = fh.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


def read_image(path: str | Path, window: Window = "auto") -> CXRImage:
    """Read a PNG, JPEG or DICOM chest X-ray; raises :class:`ImageReadError` naming file and reason."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError("file not found" if not path.exists() else "not a regular file", path)
    if path.stat().st_size == 0:
        raise ImageReadError("file is empty (0 bytes)", path)
    if is_dicom(path):
        from cxrground.io.dicom import read_dicom

        return read_dicom(path, window=window)
    return _read_raster(path, window)


def read_image_bytes(data: bytes, name: str | None = None, window: Window = "auto") -> CXRImage:
    """Read an in-memory PNG, JPEG or DICOM (an upload); ``name`` labels errors and becomes ``path``.

    DICOM is recognised by the ``DICM`` marker or a ``.dcm``/``.dicom`` name; it is read through a
    temporary file (the DICOM reader takes paths), which is removed at once.
    """
    label = name or "<uploaded bytes>"
    if not data:
        raise ImageReadError("image data is empty (0 bytes)", label)
    if (len(data) >= 132 and data[128:132] == b"DICM") or Path(label).suffix.lower() in (".dcm", ".dicom"):
        from cxrground.io.dicom import read_dicom

        with tempfile.TemporaryDirectory(prefix="cxrground-upload-") as tmp:
            tmp_path = Path(tmp) / "upload.dcm"
            tmp_path.write_bytes(data)
            try:
                image = read_dicom(tmp_path, window=window)
            except ImageReadError as exc:
                raise ImageReadError(exc.reason, label) from exc
    else:
        image = _read_raster(Path(label), window, source=io.BytesIO(data))
    return replace(image, path=name)


def read_images(
    paths: Iterable[str | Path], window: Window = "auto", progress: bool = True
) -> tuple[list[CXRImage], list[Failure]]:
    """Read many images; unreadable ones become :class:`Failure` records and the rest go on."""
    paths = list(paths)
    images: list[CXRImage] = []
    failures: list[Failure] = []
    for p in tqdm(paths, desc="images", unit="img", disable=not progress):
        try:
            images.append(read_image(p, window=window))
        except InputError as exc:
            failures.append(Failure.from_exception(p, "images", exc))
    return images, failures


def to_uint8(values: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
    """Linearly map ``[low, high]`` (default: the data range) to 0..255, clipping outside."""
    data = values.astype(np.float64, copy=False)
    lo = float(np.min(data)) if low is None else float(low)
    hi = float(np.max(data)) if high is None else float(high)
    if hi <= lo:
        return np.zeros(data.shape, dtype=np.uint8)
    scaled = (data - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def write_image(path: str | Path, pixels: np.ndarray, quality: int = 95) -> Path:
    """Write 8-bit grey (or RGB) pixels as PNG or JPEG (by suffix); JPEG uses ``quality``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.asarray(pixels)
    if arr.dtype != np.uint8:
        raise ValueError(f"write_image needs uint8 pixels, got {arr.dtype}")
    im = Image.fromarray(arr)
    suffix = path.suffix.lower()
    if suffix in (".jpg", ".jpeg"):
        im.save(path, quality=quality)
    elif suffix == ".png":
        im.save(path)
    else:
        raise ValueError(f"unsupported image suffix {suffix!r} (use .png or .jpg)")
    return path


def _read_raster(path: Path, window: Window, source: io.BytesIO | None = None) -> CXRImage:
    try:
        with Image.open(path if source is None else source) as im:
            im.load()
            mode = im.mode
            fmt = (im.format or path.suffix.lstrip(".")).lower()
            info = {k: v for k, v in im.info.items() if isinstance(v, str | int | float)}
            arr = _raster_to_array(im)
    except UnidentifiedImageError as exc:
        raise ImageReadError("not a recognised image format (PNG, JPEG or DICOM expected)", path) from exc
    except Image.DecompressionBombError as exc:
        raise ImageReadError(f"too many pixels to decode safely ({exc})", path) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"truncated or corrupt image data ({exc})", path) from exc
    bits = 8
    if arr.dtype != np.uint8:
        bits = 16 if arr.max(initial=0) > 255 or mode.startswith("I;16") else 8
        low_high = _window_bounds(arr, window)
        arr = to_uint8(arr, *low_high)
    elif isinstance(window, tuple):
        arr = to_uint8(arr, *_window_bounds(arr, window))
    fmt = "jpeg" if fmt in ("jpg", "jpeg", "mpo") else fmt
    return CXRImage(
        pixels=np.ascontiguousarray(arr),
        path=str(path),
        source_format=fmt,
        bits_stored=bits,
        metadata={"mode": mode, **info},
    )


def _raster_to_array(im: Image.Image) -> np.ndarray:
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        return np.asarray(im, dtype=np.uint16)
    if im.mode == "I":
        return np.asarray(im, dtype=np.int32)
    if im.mode == "F":
        return np.asarray(im, dtype=np.float32)
    if im.mode != "L":
        im = im.convert("L")
    return np.asarray(im, dtype=np.uint8)


def _window_bounds(arr: np.ndarray, window: Window) -> tuple[float | None, float | None]:
    if isinstance(window, tuple):
        center, width = (float(v) for v in window)
        if width <= 0:
            raise ValueError(f"window width must be positive, got {width}")
        return center - width / 2.0, center + width / 2.0
    return None, None

