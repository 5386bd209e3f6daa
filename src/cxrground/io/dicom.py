"""DICOM reading (pydicom, compressed syntaxes through pylibjpeg) and a small writer.

Conversion to 8-bit: modality LUT (RescaleSlope/Intercept or Modality LUT Sequence), then VOI:
a VOI LUT Sequence or the first WindowCenter/WindowWidth of the file (``window="auto"``), an
explicit ``(center, width)``, or the full data range (``"minmax"``, also the fallback when the
file has no VOI); LINEAR, LINEAR_EXACT and SIGMOID window functions follow DICOM PS3.3 C.11.2.1.
MONOCHROME1 is inverted last so that dense is white.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import ImageReadError
from cxrground.io.cxr_image import CXRImage, Window, to_uint8

__all__ = ["DEFLATED_REASON", "DEFLATED_SYNTAX", "apply_window", "dicom_view", "read_dicom", "refuse_deflated",
           "write_dicom"]

#: The Deflated Explicit VR Little Endian transfer syntax: the whole data set is zlib-compressed, so even its header
#: cannot be read without inflating everything (a 0.5 MB file can inflate to gigabytes). Such files are not read.
DEFLATED_SYNTAX: Final[str] = "1.2.840.10008.1.2.1.99"
DEFLATED_REASON: Final[str] = ("DICOM in the deflated transfer syntax is not read (its header lies inside the "
                               "compressed data, which could inflate to any size)")


def _transfer_syntax(head: bytes) -> str | None:
    """The transfer syntax UID of a DICOM file's meta header (group 2, always explicit VR little endian) from its
    first bytes; None when not found there."""
    i = head.find(b"\x02\x00\x10\x00UI")
    if i < 0 or i + 8 > len(head):
        return None
    n = int.from_bytes(head[i + 6:i + 8], "little")
    return head[i + 8:i + 8 + n].rstrip(b"\x00 ").decode("ascii", "replace")


def refuse_deflated(head: bytes, path: str | Path | None = None) -> None:
    """Raise :class:`ImageReadError` (:data:`DEFLATED_REASON`) when the DICOM whose first bytes (4 KiB are plenty)
    are ``head`` is in the deflated transfer syntax."""
    if _transfer_syntax(head) == DEFLATED_SYNTAX:
        raise ImageReadError(DEFLATED_REASON, path)


@contextlib.contextmanager
def _quiet_pydicom() -> Iterator[None]:
    """Silence pydicom's logger and its warnings (e.g. a lower-case ``ViewPosition``: "Invalid value for VR CS"): a
    decoder failure is raised as :class:`ImageReadError`, not logged as a traceback, and values are read as
    written."""
    logger = logging.getLogger("pydicom")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"pydicom(\.|$)")
            yield
    finally:
        logger.setLevel(level)


def read_dicom(path: str | Path, window: Window = "auto") -> CXRImage:
    """Read a single-frame (or the first frame of a multi-frame) greyscale DICOM as a :class:`CXRImage`."""
    with _quiet_pydicom():
        return _read_dicom(path, window)


def _read_dicom(path: str | Path, window: Window) -> CXRImage:
    import pydicom
    from pydicom.errors import InvalidDicomError

    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise ImageReadError(f"file cannot be read ({exc.strerror or exc})", path) from exc
    refuse_deflated(head, path)
    try:
        ds = pydicom.dcmread(path)
    except InvalidDicomError as exc:
        raise ImageReadError(f"not a valid DICOM file ({exc})", path) from exc
    except Exception as exc:  # pydicom raises many types on truncated files
        raise ImageReadError(f"cannot parse DICOM ({type(exc).__name__}: {exc})", path) from exc
    if "PixelData" not in ds and "FloatPixelData" not in ds and "DoubleFloatPixelData" not in ds:
        raise ImageReadError("DICOM has no pixel data (a structured report or presentation state?)", path)
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).strip()
    try:
        with _quiet_pydicom():
            arr = ds.pixel_array
    except Exception as exc:
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
        name = getattr(syntax, "name", str(syntax))
        hint = ("; compressed syntaxes need pylibjpeg, pylibjpeg-libjpeg and pylibjpeg-openjpeg"
                if getattr(syntax, "is_compressed", True) else " (truncated or corrupt pixel data?)")
        raise ImageReadError(f"cannot decode pixel data with transfer syntax {name} ({type(exc).__name__}: {exc})"
                             + hint, path) from exc
    metadata: dict[str, Any] = {}
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    if frames > 1:
        arr = arr[0]
        metadata["frames"] = frames
    if samples > 1:
        if arr.ndim != 3:
            raise ImageReadError(f"unexpected pixel array shape {arr.shape} for {samples} samples", path)
        arr = arr.astype(np.float64) @ np.array([0.299, 0.587, 0.114])[: arr.shape[-1]]
        photometric = "MONOCHROME2"
        metadata["converted_from"] = "colour"
    if arr.ndim != 2:
        raise ImageReadError(f"pixel data is not a 2-D image (shape {arr.shape})", path)
    pixels = _to_display(arr, ds, window)
    if photometric == "MONOCHROME1":
        pixels = 255 - pixels
    elif photometric not in ("MONOCHROME2", "MONOCHROME1") and samples == 1:
        raise ImageReadError(f"unsupported photometric interpretation {photometric!r}", path)
    spacing = _spacing(ds)
    orientation = ds.get("PatientOrientation")
    return CXRImage(
        pixels=np.ascontiguousarray(pixels),
        path=str(path),
        source_format="dicom",
        spacing=spacing,
        view=str(ds.get("ViewPosition", "")).strip() or None,
        orientation=tuple(str(v) for v in orientation)[:2] if orientation and len(orientation) >= 2 else None,
        bits_stored=int(ds.get("BitsStored", arr.dtype.itemsize * 8) or 8),
        photometric=photometric,
        metadata={
            **metadata,
            "transfer_syntax": str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "")),
            "sop_instance_uid": str(ds.get("SOPInstanceUID", "")),
            "study_instance_uid": str(ds.get("StudyInstanceUID", "")),
            "modality": str(ds.get("Modality", "")),
        },
    )


def dicom_view(path: str | Path) -> str | None:
    """The ``ViewPosition`` of a DICOM file (upper case), read from its header without the pixels; None when the
    file has none or cannot be parsed (reading the image later reports why)."""
    import pydicom

    try:
        with _quiet_pydicom():
            ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=["ViewPosition"])
    except Exception:  # pydicom raises many types on broken files; the image stage names the problem
        return None
    return str(ds.get("ViewPosition", "")).strip().upper() or None


def apply_window(values: np.ndarray, center: float, width: float, function: str = "LINEAR") -> np.ndarray:
    """DICOM VOI windowing of ``values`` to 0..255 uint8 (LINEAR, LINEAR_EXACT or SIGMOID)."""
    x = values.astype(np.float64, copy=False)
    function = (function or "LINEAR").upper()
    if function == "SIGMOID":
        out = 255.0 / (1.0 + np.exp(-4.0 * (x - center) / width))
    elif function == "LINEAR_EXACT":
        if width <= 0:
            raise ValueError(f"LINEAR_EXACT window width must be > 0, got {width}")
        out = (x - center) / width * 255.0 + 127.5
    else:
        if width < 1:
            raise ValueError(f"LINEAR window width must be >= 1, got {width}")
        out = ((x - (center - 0.5)) / (width - 1) + 0.5) * 255.0
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _to_display(arr: np.ndarray, ds: Any, window: Window) -> np.ndarray:
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    values = apply_modality_lut(arr, ds)
    if isinstance(window, tuple):
        return apply_window(values, float(window[0]), float(window[1]))
    if window == "auto":
        if "VOILUTSequence" in ds:
            item = ds.VOILUTSequence[0]
            bits = int(item.LUTDescriptor[2])
            out = apply_voi_lut(values, ds, index=0, prefer_lut=True)
            return to_uint8(out, 0, 2**bits - 1)
        center, width = _first(ds.get("WindowCenter")), _first(ds.get("WindowWidth"))
        if center is not None and width is not None and width > 0:
            return apply_window(values, center, width, str(ds.get("VOILUTFunction", "LINEAR")))
    return to_uint8(values)


def _first(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value[0]) if hasattr(value, "__len__") and not isinstance(value, str) else float(value)
    except (TypeError, ValueError, IndexError):
        return None


def _spacing(ds: Any) -> tuple[float, float] | None:
    for key in ("PixelSpacing", "ImagerPixelSpacing"):
        value = ds.get(key)
        if value is not None and len(value) == 2:
            try:
                return float(value[0]), float(value[1])
            except (TypeError, ValueError):
                continue
    return None


def write_dicom(
    path: str | Path,
    pixels: np.ndarray,
    *,
    photometric: str = "MONOCHROME2",
    bits_stored: int | None = None,
    window: tuple[float, float] | None = None,
    spacing: tuple[float, float] | None = None,
    view: str = "PA",
    rescale: tuple[float, float] | None = None,
    transfer_syntax: str | None = None,
) -> Path:
    """Write greyscale ``pixels`` (uint8 or uint16) as a Digital X-Ray DICOM; optional compression."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import DigitalXRayImageStorageForPresentation, ExplicitVRLittleEndian, generate_uid

    arr = np.asarray(pixels)
    if arr.ndim != 2 or arr.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"write_dicom needs 2-D uint8/uint16 pixels, got {arr.dtype} {arr.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[str(path.name)])
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = generate_uid(entropy_srcs=[str(path.parent)])
    ds.SeriesInstanceUID = generate_uid(entropy_srcs=[str(path.parent), "series"])
    ds.Modality = "DX"
    ds.ViewPosition = view
    ds.PatientOrientation = ["L", "F"]
    ds.Rows, ds.Columns = int(arr.shape[0]), int(arr.shape[1])
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = arr.dtype.itemsize * 8
    ds.BitsStored = bits_stored or ds.BitsAllocated
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = float(window[0]), float(window[1])
    if spacing is not None:
        ds.PixelSpacing = [float(spacing[0]), float(spacing[1])]
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = float(rescale[0]), float(rescale[1])
    ds.PixelData = arr.tobytes()
    if transfer_syntax is not None:
        ds.compress(transfer_syntax, arr, encoding_plugin="")
    ds.save_as(path, enforce_file_format=True)
    return path
