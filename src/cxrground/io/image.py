"""Chest X-ray images: one :class:`CXRImage` from PNG, JPEG or DICOM, and batch reading.

Pixels are always display-ready 8-bit grey ``(H, W)`` at the file's native resolution, with
white = dense (MONOCHROME2 convention). DICOM conversion: modality LUT (rescale), then the VOI
LUT or the first window of the file (or an explicit window, or the full data range), then
MONOCHROME1 inversion. The original bit depth, photometric interpretation, pixel spacing and
view are kept on the record. The record, :data:`Window` and :func:`to_uint8` live in
:mod:`cxrground.io.cxr_image` (shared with the DICOM reader) and are re-exported here.
"""

from __future__ import annotations

import io
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, Final, Literal

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from cxrground.errors import ConfigError, Failure, ImageReadError, InputError
from cxrground.io.cxr_image import CXRImage, Window, to_uint8
from cxrground.io.dicom import read_dicom, refuse_deflated
from cxrground.io.files import walk_files
from cxrground.io.progress import progress_bar

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DICOM_HEAD",
    "IMAGE_SUFFIXES",
    "MAX_PIXELS_HELP",
    "NOT_FILM_SUFFIXES",
    "READ_FORMATS",
    "UNSUPPORTED_IMAGE_SUFFIXES",
    "CXRImage",
    "Window",
    "as_cxr_image",
    "check_out_folder",
    "check_pixel_limit",
    "exif_orientation",
    "film_kind",
    "find_images",
    "image_header_pixels",
    "image_header_size",
    "is_dicom",
    "is_dicom_head",
    "load_pixels",
    "read_image",
    "read_image_bytes",
    "read_images",
    "sniff_type",
    "to_uint8",
    "write_image",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".dcm", ".dicom")
#: Image formats a user may have but cxrground does not read: listed by the folder readers so that reading them
#: fails with a reason and is recorded, never skipped silently.
UNSUPPORTED_IMAGE_SUFFIXES = (".gif", ".bmp", ".tif", ".tiff", ".webp")
#: Raster formats (as Pillow names them) that are read; any other (TIFF, BMP, GIF, WebP, ...) is refused by
#: content, whatever the file's name.
READ_FORMATS = frozenset({"PNG", "JPEG", "MPO"})

#: Most pixels (H x W, stated by the header) a file may have before it is decoded: 50 MP. MIMIC-CXR films are
#: about 8 MP (e.g. 2544 x 3056) and the largest digital chest radiographs about 4300 x 4300 = 18.5 MP, so 50 MP
#: leaves room for any real film while a decompression bomb (100 MP took 2.7 GB and 56 s) is refused from its
#: header. Every command that reads films sets it with ``--max-pixels``; ``None`` switches the check off.
DEFAULT_MAX_PIXELS = 50_000_000
#: The help of the ``--max-pixels`` option of every command that reads films.
MAX_PIXELS_HELP = "Images whose header states more pixels are refused (a batch records them as failures) without " \
                  "being decoded."


def sniff_type(data: bytes) -> str | None:
    """``png``, ``jpeg`` or ``dicom`` from the first bytes (at least 132 for DICOM), else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if len(data) >= 132 and data[128:132] == b"DICM":
        return "dicom"
    return None


def image_header_size(data: bytes | BinaryIO, kind: str) -> tuple[int, int]:
    """``(H, W)`` stated by the header of a ``kind`` image (bytes or a binary file); pixels are not decoded.

    Raises :class:`ImageReadError` (without a path) when the header cannot be parsed.
    """
    h, w, _ = image_header_pixels(data, kind)
    return h, w


def image_header_pixels(data: bytes | BinaryIO, kind: str) -> tuple[int, int, int]:
    """``(H, W, N)`` stated by the header of a ``kind`` image: its size and the number of values its pixel data
    holds (H x W, times the frames and samples per pixel of a DICOM), without decoding the pixels. A DICOM in the
    deflated transfer syntax (:data:`DEFLATED_SYNTAX`) is refused, since its header is inside the compressed data.

    Raises :class:`ImageReadError` (without a path) when the header cannot be parsed.
    """
    source = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    if kind == "dicom":
        import pydicom

        start = source.tell()
        refuse_deflated(source.read(4096))
        source.seek(start)
        try:
            ds = pydicom.dcmread(source, stop_before_pixels=True)
            missing = [name for name in ("Rows", "Columns") if ds.get(name) is None]
            if missing:
                raise ImageReadError(f"the DICOM header has no {' or '.join(missing)}: the file holds no image (or "
                                     "its header is damaged)")
            h, w = int(ds.Rows), int(ds.Columns)
            frames = int(ds.get("NumberOfFrames", 1) or 1)
            samples = int(ds.get("SamplesPerPixel", 1) or 1)
        except ImageReadError:
            raise
        except Exception as exc:  # pydicom raises many types on damaged headers
            raise ImageReadError(f"cannot parse DICOM header ({type(exc).__name__}: {exc})") from exc
        return h, w, h * w * max(1, frames) * max(1, samples)
    from PIL import JpegImagePlugin, PngImagePlugin

    # the format's own header parser: ``Image.open`` would refuse a decompression bomb with an error of its
    # own before the size is known; the plugin reads only the header and leaves the pixels alone
    parser = {"png": PngImagePlugin.PngImageFile, "jpeg": JpegImagePlugin.JpegImageFile}[kind]
    try:
        with parser(source) as im:
            h, w = int(im.height), int(im.width)
            if (exif_orientation(im) or 0) >= 5:  # turned a quarter: read_image gives the sides swapped
                h, w = w, h
            return h, w, h * w
    except (OSError, SyntaxError, ValueError, struct.error) as exc:
        raise ImageReadError(f"cannot parse {kind.upper()} header ({exc})") from exc


def check_pixel_limit(path: str | Path, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
    """Raise :class:`ImageReadError` naming the file when its header states more than ``max_pixels`` pixels.

    Files whose type or header is not recognised pass: the decoder then reports them.
    """
    if max_pixels is None:
        return
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return
    kind = sniff_type(head)
    if kind is None:
        return
    if kind == "dicom":
        refuse_deflated(head, path)  # its header cannot be read without inflating everything
    try:
        with path.open("rb") as fh:
            h, w, n = image_header_pixels(fh, kind)
    except (OSError, ImageReadError):
        return
    if n > max_pixels:
        per = n // max(1, h * w)
        stated = f"{w}x{h} = {h * w}" if n == h * w else f"{w}x{h} in {per} frames or samples = {n}"
        raise ImageReadError(f"too many pixels: image is {stated}, over the limit of {max_pixels} pixels "
                             "(checked from the header, not decoded; see --max-pixels)", path)

#: Bytes of a file that tell a DICOM file by its marker: the 128-byte preamble, then ``DICM``.
DICOM_HEAD: Final[int] = 132


def is_dicom_head(head: bytes) -> bool:
    """Whether a file's first :data:`DICOM_HEAD` bytes end with DICOM's ``DICM`` marker."""
    return len(head) >= DICOM_HEAD and head[128:DICOM_HEAD] == b"DICM"


def is_dicom(path: str | Path) -> bool:
    """True when the file has a DICOM suffix or the ``DICM`` preamble marker."""
    path = Path(path)
    if path.suffix.lower() in (".dcm", ".dicom"):
        return True
    try:
        with path.open("rb") as fh:
            head = fh.read(DICOM_HEAD)
    except OSError:
        return False
    return is_dicom_head(head)


def read_image(path: str | Path, window: Window = "auto", max_pixels: int | None = DEFAULT_MAX_PIXELS) -> CXRImage:
    """Read a PNG, JPEG or DICOM chest X-ray; raises :class:`ImageReadError` naming file and reason.

    A file whose header states more than ``max_pixels`` pixels is refused before decoding (None: no limit).
    """
    path = Path(path)
    if not path.is_file():
        raise ImageReadError("file not found" if not path.exists() else "not a regular file", path)
    if path.stat().st_size == 0:
        raise ImageReadError("file is empty (0 bytes)", path)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ImageReadError(f"file cannot be read ({exc.strerror or exc})", path) from exc
    check_pixel_limit(path, max_pixels)
    if is_dicom(path):
        return read_dicom(path, window=window)
    return _read_raster(path, window)


def as_cxr_image(image: CXRImage | str | Path | np.ndarray, what: str = "image") -> CXRImage:
    """``image`` as a :class:`CXRImage`: a CXRImage as it is, a file path read by :func:`read_image`, a 2-D
    uint8 array wrapped; anything else is an :class:`InputError` saying what is accepted."""
    if isinstance(image, CXRImage):
        return image
    if isinstance(image, str | Path):
        return read_image(image)
    if isinstance(image, np.ndarray):
        if image.ndim == 2 and image.dtype == np.uint8:
            return CXRImage(pixels=image)
        raise InputError(f"{what}: an array must be 2-D uint8 grey pixels, got {image.dtype} {image.shape} (read "
                         "films with read_image(path))")
    raise InputError(f"{what}: expected a CXRImage, a file path or a 2-D uint8 array, got {type(image).__name__} "
                     "(read films with read_image(path))")


def read_image_bytes(data: bytes, name: str | None = None, window: Window = "auto") -> CXRImage:
    """Read an in-memory PNG, JPEG or DICOM (an upload); ``name`` labels errors and becomes ``path``.

    DICOM is recognised by the ``DICM`` marker or a ``.dcm``/``.dicom`` name; it is read through a
    temporary file (the DICOM reader takes paths), which is removed at once.
    """
    label = name or "<uploaded bytes>"
    if not data:
        raise ImageReadError("image data is empty (0 bytes)", label)
    if (len(data) >= 132 and data[128:132] == b"DICM") or Path(label).suffix.lower() in (".dcm", ".dicom"):
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
    paths: Iterable[str | Path], window: Window = "auto", progress: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> tuple[list[CXRImage], list[Failure]]:
    """Read many images; unreadable ones become :class:`Failure` records and the rest go on."""
    paths = list(paths)
    images: list[CXRImage] = []
    failures: list[Failure] = []
    for p in progress_bar(paths, desc="images", unit="img", progress=progress):
        try:
            images.append(read_image(p, window=window, max_pixels=max_pixels))
        except InputError as exc:
            failures.append(Failure.from_exception(p, "images", exc))
    return images, failures


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


def load_pixels(im: Image.Image) -> None:
    """Decode every pixel of ``im``; a truncated file raises ``OSError`` even where another library (lmms-eval
    does) has switched on Pillow's process-wide ``ImageFile.LOAD_TRUNCATED_IMAGES``."""
    from PIL import ImageFile

    tolerant = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        im.load()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = tolerant


def _read_raster(path: Path, window: Window, source: io.BytesIO | None = None) -> CXRImage:
    try:
        with Image.open(path if source is None else source) as im:
            if im.format not in READ_FORMATS:
                raise ImageReadError(f"unsupported image format {im.format or path.suffix or 'unknown'} (use JPEG, "
                                     "PNG or DICOM)", path)
            load_pixels(im)
            mode = im.mode
            fmt = (im.format or path.suffix.lstrip(".")).lower()
            info = {k: v for k, v in im.info.items() if isinstance(v, str | int | float)}
            turned = exif_orientation(im)
            if turned:  # stored turned or mirrored: read as every viewer shows it (and masks line up with that)
                info["exif_orientation"] = turned
                arr = _raster_to_array(ImageOps.exif_transpose(im))
            else:
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


def exif_orientation(im: Image.Image) -> int | None:
    """The EXIF Orientation of a raster other than upright (2-8: mirrored, turned or both), else None."""
    try:
        value = im.getexif().get(0x0112)
    except Exception:  # a damaged EXIF block: the pixels as stored
        return None
    return int(value) if isinstance(value, int) and 2 <= value <= 8 else None


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


#: Suffixes of files that are never films (reports, tables, notes, archives, cxrground's own outputs): a folder
#: reader does not open them to look for a DICOM marker.
NOT_FILM_SUFFIXES: Final[frozenset[str]] = frozenset({
    ".txt", ".xml", ".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".gz", ".zip", ".tar", ".md", ".html", ".htm",
    ".pdf", ".log", ".yaml", ".yml", ".py", ".sha256", ".npz", ".npy", ".safetensors", ".pt", ".db", ".sqlite"})


def film_kind(path: Path) -> Literal["film", "unsupported"] | None:
    """What a file met in a folder is to the folder readers: ``film`` for a PNG, JPEG or DICOM suffix (a broken link
    or a folder of such a name too: reading it fails and is recorded), and for a regular file with any other suffix
    that holds DICOM's ``DICM`` marker at byte 128 (a DICOM export named by its UID, ``1.2.840.113619.2.55.3.604``,
    or with no suffix; 132 bytes read); ``unsupported`` for a GIF, BMP, TIFF or WebP suffix; None for any other
    file (a report, a table, a file of no image kind)."""
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "film"
    if suffix in UNSUPPORTED_IMAGE_SUFFIXES:
        return "unsupported"
    if suffix in NOT_FILM_SUFFIXES or not path.is_file():
        return None
    return "film" if is_dicom(path) else None


def find_images(folder: Path) -> list[Path]:
    """The films under ``folder``, sorted (:func:`film_kind`): PNG, JPEG and DICOM files, DICOM files without an
    image suffix (found by their ``DICM`` marker), links to them (a broken link is listed, so that reading it fails
    and is recorded) and files of the :data:`UNSUPPORTED_IMAGE_SUFFIXES` (listed so that their refusal is recorded);
    links to folders are followed. An error naming the folder when there is none."""
    if not folder.is_dir():
        raise InputError("image folder not found", folder)
    paths = [p for p in walk_files(folder) if film_kind(p) is not None]
    if not any(p.suffix.lower() not in UNSUPPORTED_IMAGE_SUFFIXES for p in paths):
        raise InputError("no PNG, JPEG or DICOM images in the folder" + (
            f" ({len(paths)} file(s) in formats cxrground does not read: {', '.join(UNSUPPORTED_IMAGE_SUFFIXES)})"
            if paths else ""), folder)
    return paths


def check_out_folder(out: Path, images: Path) -> None:
    """A :class:`~cxrground.errors.ConfigError` when the output folder ``out`` is the image folder ``images`` or
    lies inside it (the images written there would be read as films by the next run on that folder)."""
    if out.resolve().is_relative_to(images.resolve()):
        where = "is the image folder" if out.resolve() == images.resolve() else f"lies inside the image folder {images}"
        raise ConfigError(f"output folder {out} {where}: its images would be read as films by the next run; "
                          "write to a folder outside the image folder")
