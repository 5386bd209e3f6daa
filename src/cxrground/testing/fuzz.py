"""A generator of bad inputs for the command-line tools (test helper, not for production).

Each writer puts one kind of bad (or merely odd) input file at a path and returns a :class:`FuzzInput`
saying what it is and whether a tool must *record* it as a failure (``bad``) or *process* it like any other
input (odd but valid: 16-bit and RGBA PNGs, unicode and space file names). The kinds cover what an outside
audit fed to ``ils build``, ``ils predict``, ``ils evaluate``, ``percept build`` and ``percept eval``:
truncated, zero-byte and oversized images, text named ``.jpg``, DICOM without pixels or with a broken transfer
syntax, empty / binary / non-UTF-8 reports, wrong-size masks, malformed prediction lines and broken benchmark
JSON. :func:`corrupt_images` and :func:`corrupt_reports` apply them to a copy of a MIMIC-layout image folder
(e.g. a synthetic cohort's ``files/``), study by study in sorted order, so the corpus is deterministic.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cxrground.io.dicom import write_dicom
from cxrground.io.image import read_image

__all__ = [
    "BAD_BENCHMARK_JSON",
    "BAD_PREDICTION_LINES",
    "FOLDER_KINDS",
    "IMAGE_KINDS",
    "REPORT_KINDS",
    "FuzzInput",
    "corrupt_images",
    "corrupt_reports",
    "corrupt_study_folders",
    "png_bytes",
    "wrong_size_mask",
]


@dataclass(frozen=True)
class FuzzInput:
    """One generated input: its kind, its file and whether a tool must record it as a failure."""

    kind: str
    path: Path
    bad: bool


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(width: int, height: int) -> bytes:
    """A valid all-black 8-bit grey PNG of ``width`` x ``height``; a huge one stays small on disk."""
    comp = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def _truncated(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[:200])
    return path


def _zero_bytes(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _text_as_jpg(path: Path) -> Path:
    path.write_text("FINDINGS: this is a report saved under an image name.\n", encoding="utf-8")
    return path


def _pixel_bomb(path: Path) -> Path:
    """A 20000 x 20000 PNG (400 MP, 390 kB on disk) in place of the image."""
    path.unlink()
    out = path.with_suffix(".png")
    out.write_bytes(png_bytes(20_000, 20_000))
    return out


def _dicom_without_pixels(path: Path) -> Path:
    import pydicom

    out = path.with_suffix(".dcm")
    write_dicom(out, np.zeros((8, 8), np.uint16))
    ds = pydicom.dcmread(out)
    del ds.PixelData
    ds.save_as(out, enforce_file_format=True)
    path.unlink()
    return out


def _dicom_broken_syntax(path: Path) -> Path:
    """A DICOM whose transfer syntax says JPEG 2000 over raw (non-JPEG) pixel bytes."""
    import pydicom

    out = path.with_suffix(".dcm")
    write_dicom(out, np.zeros((8, 8), np.uint16))
    ds = pydicom.dcmread(out)
    ds.file_meta.TransferSyntaxUID = pydicom.uid.JPEG2000Lossless
    ds.PixelData = pydicom.encaps.encapsulate([b"\x00\x01\x02\x03 not a codestream"])
    ds.save_as(out)
    path.unlink()
    return out


def _sixteen_bit(path: Path) -> Path:
    from PIL import Image

    pixels = read_image(path).pixels.astype(np.uint16) * 257
    out = path.with_suffix(".png")
    Image.fromarray(pixels).save(out)  # uint16 → a 16-bit grey PNG
    path.unlink()
    return out


def _rgba(path: Path) -> Path:
    from PIL import Image

    grey = read_image(path).pixels
    out = path.with_suffix(".png")
    Image.fromarray(np.dstack([grey, grey, grey, np.full_like(grey, 255)])).save(out)
    path.unlink()
    return out


def _unicode_space_name(path: Path) -> Path:
    out = path.with_name("dé jà vu ☃ " + path.name)
    path.rename(out)
    return out


#: Image kinds: name → (writer replacing the file at a path and returning the new file, bad?).
IMAGE_KINDS: dict[str, tuple[Callable[[Path], Path], bool]] = {
    "truncated": (_truncated, True),
    "zero-byte": (_zero_bytes, True),
    "text named .jpg": (_text_as_jpg, True),
    "20000x20000 png": (_pixel_bomb, True),
    "dicom without pixels": (_dicom_without_pixels, True),
    "dicom broken transfer syntax": (_dicom_broken_syntax, True),
    "16-bit png": (_sixteen_bit, False),
    "rgba png": (_rgba, False),
    "unicode and space name": (_unicode_space_name, False),
}

#: Report kinds: name → bytes written in place of the report (all bad: no usable text).
REPORT_KINDS: dict[str, bytes] = {
    "empty report": b"",
    "binary report": bytes(range(256)) * 4,
    "non-UTF-8 report": "FINDINGS: Épanchement pleural à droite.\n".encode("latin-1"),
}


def _empty_study_folder(image: Path) -> Path:
    for path in image.parent.iterdir():
        path.unlink()
    return image.parent


def _folder_named_like_image(image: Path) -> Path:
    image.unlink()
    image.mkdir()
    return image


def _other_format(suffix: str, pil_format: str) -> Callable[[Path], Path]:
    def write(image: Path) -> Path:
        from PIL import Image

        out = image.with_suffix(suffix)
        Image.fromarray(read_image(image).pixels).save(out, format=pil_format)
        image.unlink()
        return out

    return write


#: Study-folder kinds a scan must record (each once, naming the returned path) rather than skip without a word:
#: name → writer taking a study's image and returning the path the failure names.
FOLDER_KINDS: dict[str, Callable[[Path], Path]] = {
    "empty study folder": _empty_study_folder,
    "folder named like an image": _folder_named_like_image,
    "gif image": _other_format(".gif", "GIF"),
    "bmp image": _other_format(".bmp", "BMP"),
    "tiff image": _other_format(".tiff", "TIFF"),
}


def _study_images(files: Path) -> list[Path]:
    """The images of a MIMIC-layout folder, one per study, sorted by study folder."""
    studies = sorted(p for p in files.glob("p*/p*/s*") if p.is_dir())
    return [sorted(s.iterdir())[0] for s in studies if any(s.iterdir())]


def corrupt_images(files: Path, kinds: Sequence[str] = tuple(IMAGE_KINDS), start: int = 0) -> list[FuzzInput]:
    """Apply each image kind to one study's image of ``files`` (studies ``start``, ``start + 1`` ...)."""
    images = _study_images(files)[start:]
    if len(images) < len(kinds):
        raise ValueError(f"{files} has {len(images)} studies after {start}; {len(kinds)} image kinds need one each")
    out = []
    for kind, image in zip(kinds, images, strict=False):
        writer, bad = IMAGE_KINDS[kind]
        out.append(FuzzInput(kind, writer(image), bad))
    return out


def corrupt_study_folders(files: Path, kinds: Sequence[str] = tuple(FOLDER_KINDS), start: int = 0
                          ) -> list[FuzzInput]:
    """Apply each study-folder kind to one study of ``files`` (studies ``start``, ``start + 1`` ...); all bad."""
    images = _study_images(files)[start:]
    if len(images) < len(kinds):
        raise ValueError(f"{files} has {len(images)} studies after {start}; {len(kinds)} folder kinds need one each")
    return [FuzzInput(kind, FOLDER_KINDS[kind](image), True) for kind, image in zip(kinds, images, strict=False)]


def corrupt_reports(files: Path, kinds: Sequence[str] = tuple(REPORT_KINDS), start: int = 0) -> list[FuzzInput]:
    """Replace the report ``sNNN.txt`` of one study per kind (studies ``start``, ``start + 1`` ...)."""
    images = _study_images(files)[start:]
    if len(images) < len(kinds):
        raise ValueError(f"{files} has {len(images)} studies after {start}; {len(kinds)} report kinds need one each")
    out = []
    for kind, image in zip(kinds, images, strict=False):
        report = image.parent.parent / f"{image.parent.name}.txt"
        report.write_bytes(REPORT_KINDS[kind])
        out.append(FuzzInput(kind, report, True))
    return out


def wrong_size_mask(path: Path) -> FuzzInput:
    """Rewrite the mask PNG at ``path`` at half its width (a mask that matches no image)."""
    from PIL import Image

    with Image.open(path) as im:
        im.resize((max(1, im.width // 2), im.height)).save(path)
    return FuzzInput("wrong-size mask", path, True)


#: Malformed predictions-file lines for a pair id and a native ``(H, W)``: kind → line text.
BAD_PREDICTION_LINES: dict[str, Callable[[str, tuple[int, int]], str]] = {
    "not JSON": lambda pid, hw: '{"pair_id": "' + pid + '", "mask": ',
    "not an object": lambda pid, hw: json.dumps([pid]),
    "RLE of another size": lambda pid, hw: json.dumps({"pair_id": pid, "mask": {"size": [hw[0] + 1, hw[1]],
                                                                                 "counts": [(hw[0] + 1) * hw[1]]}}),
    "RLE covering half the image": lambda pid, hw: json.dumps({"pair_id": pid, "mask": {
        "size": list(hw), "counts": [hw[0] * hw[1] // 2]}}),
    "negative RLE counts": lambda pid, hw: json.dumps({"pair_id": pid, "mask": {
        "size": list(hw), "counts": [-1, hw[0] * hw[1] + 1]}}),
    "non-ASCII RLE counts": lambda pid, hw: json.dumps({"pair_id": pid, "mask": {"size": list(hw), "counts": "é"}},
                                                       ensure_ascii=False),
    "claimed 40000x40000": lambda pid, hw: json.dumps({"pair_id": pid, "mask": {"size": [40_000, 40_000],
                                                                                 "counts": "0"}}),
}

#: Broken ``chexpercept.json`` contents: kind → bytes.
BAD_BENCHMARK_JSON: dict[str, bytes] = {
    "not JSON": b'{"pneumonia_s1_positive_0": {',
    "non-UTF-8": '{"é": 1}'.encode("latin-1"),
    "a list": b"[1, 2, 3]",
    "no cases": b"{}",
    "case without questions": b'{"pneumonia_s1_positive_0": {"dicom_id": "d"}}',
}
