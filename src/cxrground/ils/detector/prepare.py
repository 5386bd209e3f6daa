"""The YOLO training set made from VinDr-CXR files: fused boxes, split, letterboxed images, labels, dataset YAML.

Layout of ``DATA`` (resumable: an image whose ``meta/<image_id>.json`` exists is not redone; the settings of a
half-made folder must match, see ``settings.json``)::

    settings.json                     the preparation settings (classes, size, split, fusion)
    images/{train,val,test}/ID.png    8-bit grey film letterboxed (aspect kept, centred, black padding) to size²
    labels/{train,val,test}/ID.txt    one ``class cx cy w h`` line per fused box (YOLO format, 0..1)
    meta/ID.json                      split, group, source file, letterbox record, fused boxes in canvas pixels
    manifest.jsonl                    every meta record, sorted by image id (its sha256 is the data hash)
    failures.jsonl                    images that could not be used, with the reason
    data.yaml                         the ultralytics dataset file (path, train, val, test, names)

The letterbox is :class:`cxrground.io.transform.Letterbox` centred with black padding, the same transform ``ils
build`` puts the film through before the detector sees it (at its own working size).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image

from cxrground.errors import ConfigError, Failure, InputError
from cxrground.ils.detector.vindr import (
    FusedBox,
    ReaderBox,
    assign_split,
    class_list,
    find_images,
    fuse_readers,
    read_annotations,
    read_patients,
)
from cxrground.io.files import atomic_write_text, sha256_bytes, sha256_file
from cxrground.io.transform import Letterbox
from cxrground.io.workers import stop_workers, worker_pool

__all__ = ["SPLITS", "PrepareSettings", "PreparedData", "load_manifest", "prepare_dataset"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class PrepareSettings:
    """What decides the prepared files (a folder is reused only with the same settings)."""

    classes: Literal["kept", "all"] = "kept"
    imgsz: int = 1024
    val: float = 0.1
    test: float = 0.1
    seed: int = 0
    fusion_iou: float = 0.4
    min_readers: int = 1
    by_patient: bool = False
    only_split: str | None = None
    """Put every film in this split (a separately annotated evaluation set, e.g. VinDr-CXR's test files)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass
class PreparedData:
    """Summary of a prepared folder."""

    folder: Path
    classes: tuple[str, ...]
    images: dict[str, int]
    boxes: dict[str, dict[str, int]]
    failures: int
    data_sha256: str
    annotations_sha256: str
    settings: PrepareSettings
    failures_list: list[dict[str, Any]] = field(default_factory=list)

    @property
    def yaml(self) -> Path:
        """The ultralytics dataset file."""
        return self.folder / "data.yaml"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the failure records)."""
        return {"folder": str(self.folder), "classes": list(self.classes), "images": self.images, "boxes": self.boxes,
                "failures": self.failures, "data_sha256": self.data_sha256,
                "annotations_sha256": self.annotations_sha256, "settings": self.settings.to_dict()}


def _canvas_boxes(fused: Sequence[FusedBox], box: Letterbox, src_scale: tuple[float, float]) -> list[FusedBox]:
    """Fused boxes (original pixel edges) on the letterboxed canvas, clipped to the film, empty ones dropped."""
    sy, sx = box.scale_yx
    (oy, ox), (rh, rw) = box.offset_yx, box.resized_hw
    out = []
    for b in fused:
        c = b.scaled(sx * src_scale[1], sy * src_scale[0], ox, oy)
        x0, x1 = min(max(c.x0, ox), ox + rw), min(max(c.x1, ox), ox + rw)
        y0, y1 = min(max(c.y0, oy), oy + rh), min(max(c.y1, oy), oy + rh)
        if x1 - x0 >= 1 and y1 - y0 >= 1:
            out.append(FusedBox(b.class_name, round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2), b.readers,
                                b.support))
    return out


def _prepare_one(job: tuple[str, str, str, str, list[ReaderBox], int, tuple[int, int] | None, str,
                            PrepareSettings, tuple[str, ...]]) -> dict[str, Any]:
    """Read, letterbox and write one image with its label file and meta record (run in a worker)."""
    from cxrground.io.image import read_image

    image_id, source, split, group, reader_boxes, n_readers, orig_hw, folder, settings, classes = job
    out = Path(folder)
    pixels = read_image(source).pixels
    h, w = pixels.shape
    src_scale = (h / orig_hw[0], w / orig_hw[1]) if orig_hw else (1.0, 1.0)
    fused = [b for b in fuse_readers(reader_boxes, n_readers, settings.fusion_iou, settings.min_readers)
             if b.class_name in classes]
    box = Letterbox.fit((h, w), settings.imgsz)
    canvas = box.image_to_canvas(pixels, fill=0)
    boxes = _canvas_boxes(fused, box, src_scale)
    png = out / "images" / split / f"{image_id}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(png, compress_level=1)
    size = float(settings.imgsz)
    lines = [f"{classes.index(b.class_name)} {(b.x0 + b.x1) / 2 / size:.6f} {(b.y0 + b.y1) / 2 / size:.6f} "
             f"{(b.x1 - b.x0) / size:.6f} {(b.y1 - b.y0) / size:.6f}" for b in boxes]
    atomic_write_text(out / "labels" / split / f"{image_id}.txt", "".join(f"{line}\n" for line in lines))
    meta = {"image_id": image_id, "split": split, "group": group, "source": str(source), "native_hw": [h, w],
            "letterbox": box.to_dict(), "image": f"images/{split}/{image_id}.png", "png_sha256": sha256_file(png),
            "boxes": [asdict(b) for b in boxes]}
    atomic_write_text(out / "meta" / f"{image_id}.json", json.dumps(meta, sort_keys=True) + "\n")
    return meta


def prepare_dataset(annotations: str | Path, images: str | Path, folder: str | Path,
                    settings: PrepareSettings = PrepareSettings(), patients: str | Path | None = None,
                    workers: int = 1, max_images: int | None = None) -> PreparedData:
    """Make (or finish) the YOLO dataset folder ``folder`` from a VinDr-CXR annotations CSV and its images.

    ``patients`` (``image_id,patient_id`` CSV) makes the split patient-level. ``max_images`` keeps the first
    images by id (quick runs). Missing or unreadable images are recorded in ``failures.jsonl``; the rest go on.
    """
    out = Path(folder)
    classes = class_list(settings.classes)
    if settings.imgsz < 32 or settings.imgsz % 32:
        raise ConfigError(f"image size must be a multiple of 32 (YOLO's stride), got {settings.imgsz}")
    settings = PrepareSettings(**{**settings.to_dict(), "by_patient": patients is not None})
    if settings.only_split not in (None, *SPLITS):
        raise ConfigError(f"only_split must be one of {', '.join(SPLITS)}, got {settings.only_split!r}")
    boxes, readers, sizes = read_annotations(annotations)
    groups = read_patients(patients) if patients is not None else {}
    settings_file = out / "settings.json"
    if settings_file.is_file():
        try:
            old = json.loads(settings_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"settings of a prepared dataset are not JSON ({exc}); use another folder",
                             settings_file) from exc
        if old != settings.to_dict():
            raise ConfigError(f"{out} was prepared with other settings ({old}); use another folder or --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(settings_file, json.dumps(settings.to_dict(), indent=1) + "\n")
    ids = sorted(readers)[:max_images] if max_images else sorted(readers)
    found = find_images(images, ids)
    failures: list[Failure] = []
    jobs = []
    metas: dict[str, dict[str, Any]] = {}
    for image_id in ids:
        meta_file = out / "meta" / f"{image_id}.json"
        if meta_file.is_file():
            metas[image_id] = json.loads(meta_file.read_text())
            continue
        if image_id not in found:
            failures.append(Failure(str(Path(images) / image_id), "detector-prepare", "no image file for this "
                                    "image_id (.dicom, .dcm, .png, .jpg)", "InputError"))
            continue
        group = groups.get(image_id, image_id)
        split = settings.only_split or assign_split(group, settings.seed, settings.val, settings.test)
        jobs.append((image_id, str(found[image_id]), split, group, boxes.get(image_id, []),
                     max(1, len(readers[image_id])), sizes.get(image_id), str(out), settings, classes))
    for job, result in zip(jobs, _run(jobs, workers), strict=True):
        if isinstance(result, BaseException):
            failures.append(Failure.from_exception(job[1], "detector-prepare", result))
        else:
            metas[job[0]] = result
    manifest = "".join(json.dumps(metas[k], sort_keys=True) + "\n" for k in sorted(metas))
    atomic_write_text(out / "manifest.jsonl", manifest)
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f.to_dict()) + "\n" for f in failures))
    counts = Counter(m["split"] for m in metas.values())
    per_class: dict[str, Counter] = {s: Counter() for s in SPLITS}
    for m in metas.values():
        per_class[m["split"]].update(b["class_name"] for b in m["boxes"])
    atomic_write_text(out / "data.yaml", dataset_yaml(out, classes))
    return PreparedData(out, classes, {s: counts.get(s, 0) for s in SPLITS},
                        {s: dict(sorted(per_class[s].items())) for s in SPLITS}, len(failures),
                        sha256_bytes(manifest.encode()), sha256_file(annotations), settings,
                        [f.to_dict() for f in failures])


def _run(jobs: list[tuple], workers: int) -> list[dict[str, Any] | BaseException]:
    """:func:`_prepare_one` over the jobs, in order; an input error becomes the job's result instead of raising."""
    def safe(job: tuple) -> dict[str, Any] | BaseException:
        try:
            return _prepare_one(job)
        except (InputError, OSError, ValueError) as exc:
            return exc

    if workers <= 1 or len(jobs) < 2:
        return [safe(j) for j in jobs]
    results: list[dict[str, Any] | BaseException] = []
    with worker_pool(workers, context=None) as pool:
        try:
            futures = [pool.submit(_prepare_one, j) for j in jobs]
            for f in futures:
                exc = f.exception()
                if exc is not None and not isinstance(exc, InputError | OSError | ValueError):
                    raise exc
                results.append(f.result() if exc is None else exc)
        except KeyboardInterrupt:  # the workers ignore Ctrl-C: end them
            stop_workers(pool)
            raise
    return results


def dataset_yaml(folder: Path, classes: Sequence[str]) -> str:
    """The ultralytics dataset file: absolute ``path``, the three split folders, ``names`` (JSON-quoted strings)."""
    lines = [f"path: {json.dumps(str(folder.resolve()))}", *(f"{s}: images/{s}" for s in SPLITS), "names:"]
    lines += [f"  {i}: {json.dumps(name)}" for i, name in enumerate(classes)]
    return "\n".join(lines) + "\n"


def load_manifest(folder: str | Path) -> list[dict[str, Any]]:
    """The meta records of a prepared folder (``manifest.jsonl``)."""
    path = Path(folder) / "manifest.jsonl"
    if not path.is_file():
        raise InputError("no manifest.jsonl: not a prepared detector dataset (run cxrground detector train)",
                         Path(folder))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def canvas_array(folder: str | Path, meta: dict[str, Any]) -> np.ndarray:
    """The letterboxed grey film of one manifest record."""
    return np.asarray(Image.open(Path(folder) / meta["image"]).convert("L"))
