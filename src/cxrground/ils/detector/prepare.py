"""The YOLO training set made from VinDr-CXR files: fused boxes, split, letterboxed images, labels, dataset YAML.

Layout of ``DATA`` (resumable: an image whose ``meta/<image_id>.json`` exists is not redone; the settings and
inputs of a half-made folder must match, see ``settings.json``; ``overwrite`` makes it again when they do not)::

    settings.json                     the preparation settings (classes, size, split, fusion) and ``inputs``: the
                                      annotations and patients sha256, the resolved film folder
    images/{train,val,test}/ID.png    8-bit grey film letterboxed (aspect kept, centred, black padding) to size²
    labels/{train,val,test}/ID.txt    one ``class cx cy w h`` line per fused box (YOLO format, 0..1)
    meta/ID.json                      split, group, source file, letterbox record, fused boxes in canvas pixels,
                                      ``outside``: fused boxes clipped to the film or dropped (wholly outside it)
    manifest.jsonl                    every meta record, sorted by image id (its sha256 is the data hash)
    failures.jsonl                    images that could not be used, with the reason
    data.yaml                         the ultralytics dataset file (path, train, val, test, names)

The letterbox is :class:`cxrground.io.transform.Letterbox` centred with black padding, the same transform ``ils
build`` puts the film through before the detector sees it (at its own working size).

Boxes that run past their film are clipped to it, those wholly outside are dropped; both are counted per split.
When more than :data:`OUTSIDE_LIMIT` of the boxes lie outside, preparation stops: the coordinates are most likely
in the pixels of the original DICOM while the films read are resized copies (the ``width``/``height`` columns).
"""

from __future__ import annotations

import json
import shutil
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
from cxrground.io.files import atomic_write_text, read_json_object, sha256_bytes, sha256_file
from cxrground.io.transform import Letterbox
from cxrground.io.workers import stop_workers, worker_pool

__all__ = ["OUTSIDE_LIMIT", "SPLITS", "WEIGHTS_NAME", "PrepareSettings", "PreparedData", "PreparedInputs",
           "load_manifest", "prepare_dataset", "prepared_changes"]

SPLITS = ("train", "val", "test")
#: The trained weights in a training's output folder (beside its prepared ``data/``).
WEIGHTS_NAME = "vindr_yolo.pt"
#: Share of the fused boxes that may lie partly or wholly outside their film before preparation stops.
OUTSIDE_LIMIT = 0.1
#: What ``prepare_dataset`` writes in its folder (cleared when the folder is made again).
_PREPARED = ("images", "labels", "meta", "manifest.jsonl", "failures.jsonl", "data.yaml", "settings.json")


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


@dataclass(frozen=True)
class PreparedInputs:
    """The files a prepared folder was made from: annotations and patients sha256, the resolved film folder."""

    annotations_sha256: str
    patients_sha256: str | None
    images: str

    @classmethod
    def of(cls, annotations: str | Path, images: str | Path, patients: str | Path | None = None) -> PreparedInputs:
        """The inputs as they are now (a missing file is an :class:`~cxrground.errors.InputError`)."""
        for path, what in ((annotations, "annotations file"), (patients, "patients file")):
            if path is not None and not Path(path).is_file():
                raise InputError(f"{what} not found", path)
        return cls(sha256_file(annotations), sha256_file(patients) if patients is not None else None,
                   str(Path(images).resolve()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def prepared_changes(recorded: dict[str, Any], settings: PrepareSettings, inputs: PreparedInputs) -> list[str]:
    """What differs between a recorded ``settings.json`` (settings and ``inputs``) and these: one phrase each."""
    changes = []
    old_inputs = recorded.get("inputs")
    if not isinstance(old_inputs, dict):
        changes.append("its inputs (annotations, patients, films) were not recorded")
    else:
        names = {"annotations_sha256": "annotations file", "patients_sha256": "patients file",
                 "images": "film folder"}
        for key, value in inputs.to_dict().items():
            old = old_inputs.get(key)
            if old != value:
                changes.append(f"{names[key]} {_short(old)} → {_short(value)}")
    old_settings = {k: v for k, v in recorded.items() if k != "inputs"}
    for key, value in settings.to_dict().items():
        if old_settings.get(key) != value:
            changes.append(f"{key} {old_settings.get(key)!r} → {value!r}")
    return changes


def _short(value: Any) -> str:
    """A sha256 as its first 12 digits, a path as it is, nothing as 'none'."""
    if value is None:
        return "none"
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def read_prepared_settings(folder: Path) -> dict[str, Any] | None:
    """The ``settings.json`` of a prepared folder, ``None`` when there is none."""
    path = folder / "settings.json"
    if not path.is_file():
        return None
    return read_json_object(path, "settings of a prepared dataset (use another folder or --overwrite)")


def _clear_prepared(folder: Path) -> None:
    """Remove what :func:`prepare_dataset` wrote in ``folder`` (and nothing else)."""
    for name in _PREPARED:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


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
    inputs: PreparedInputs
    outside: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per split: fused boxes ``clipped`` to their film and ``dropped`` (wholly outside it)."""
    films_without_patient: int | None = None
    """With a patients file: annotated films it gives no patient id (each split as its own group)."""
    failures_list: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def yaml(self) -> Path:
        """The ultralytics dataset file."""
        return self.folder / "data.yaml"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the failure records)."""
        return {"folder": str(self.folder), "classes": list(self.classes), "images": self.images, "boxes": self.boxes,
                "failures": self.failures, "data_sha256": self.data_sha256,
                "annotations_sha256": self.annotations_sha256, "inputs": self.inputs.to_dict(),
                "outside": self.outside, "films_without_patient": self.films_without_patient,
                "settings": self.settings.to_dict()}


def _canvas_boxes(fused: Sequence[FusedBox], box: Letterbox,
                  src_scale: tuple[float, float]) -> tuple[list[FusedBox], dict[str, int]]:
    """Fused boxes (original pixel edges) on the letterboxed canvas, clipped to the film, empty ones dropped; with
    the counts of boxes ``clipped`` (an edge moved by more than half a canvas pixel) and ``dropped``."""
    sy, sx = box.scale_yx
    (oy, ox), (rh, rw) = box.offset_yx, box.resized_hw
    out = []
    outside = {"clipped": 0, "dropped": 0}
    for b in fused:
        c = b.scaled(sx * src_scale[1], sy * src_scale[0], ox, oy)
        x0, x1 = min(max(c.x0, ox), ox + rw), min(max(c.x1, ox), ox + rw)
        y0, y1 = min(max(c.y0, oy), oy + rh), min(max(c.y1, oy), oy + rh)
        if x1 - x0 >= 1 and y1 - y0 >= 1:
            out.append(FusedBox(b.class_name, round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2), b.readers,
                                b.support))
            moved = max(abs(x0 - c.x0), abs(x1 - c.x1), abs(y0 - c.y0), abs(y1 - c.y1))
            outside["clipped"] += moved > 0.5
        else:
            outside["dropped"] += 1
    return out, outside


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
    boxes, outside = _canvas_boxes(fused, box, src_scale)
    png = out / "images" / split / f"{image_id}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(png, compress_level=1)
    size = float(settings.imgsz)
    lines = [f"{classes.index(b.class_name)} {(b.x0 + b.x1) / 2 / size:.6f} {(b.y0 + b.y1) / 2 / size:.6f} "
             f"{(b.x1 - b.x0) / size:.6f} {(b.y1 - b.y0) / size:.6f}" for b in boxes]
    atomic_write_text(out / "labels" / split / f"{image_id}.txt", "".join(f"{line}\n" for line in lines))
    meta = {"image_id": image_id, "split": split, "group": group, "source": str(source), "native_hw": [h, w],
            "letterbox": box.to_dict(), "image": f"images/{split}/{image_id}.png", "png_sha256": sha256_file(png),
            "boxes": [asdict(b) for b in boxes], "outside": outside}
    atomic_write_text(out / "meta" / f"{image_id}.json", json.dumps(meta, sort_keys=True) + "\n")
    return meta


def prepare_dataset(annotations: str | Path, images: str | Path, folder: str | Path,
                    settings: PrepareSettings = PrepareSettings(), patients: str | Path | None = None,
                    workers: int = 1, max_images: int | None = None, overwrite: bool = False,
                    hint: str = "use another folder or --overwrite") -> PreparedData:
    """Make (or finish) the YOLO dataset folder ``folder`` from a VinDr-CXR annotations CSV and its images.

    ``patients`` (``image_id,patient_id`` CSV) makes the split patient-level. ``max_images`` keeps the first
    images by id (quick runs). Missing or unreadable images are recorded in ``failures.jsonl``; the rest go on.
    A folder prepared from other inputs or settings is made again with ``overwrite``, else refused (a
    :class:`~cxrground.errors.ConfigError` naming what changed, then ``hint``).
    """
    out = Path(folder)
    classes = class_list(settings.classes)
    if settings.imgsz < 32 or settings.imgsz % 32:
        raise ConfigError(f"image size must be a multiple of 32 (YOLO's stride), got {settings.imgsz}")
    settings = PrepareSettings(**{**settings.to_dict(), "by_patient": patients is not None})
    if settings.only_split not in (None, *SPLITS):
        raise ConfigError(f"only_split must be one of {', '.join(SPLITS)}, got {settings.only_split!r}")
    inputs = PreparedInputs.of(annotations, images, patients)
    boxes, readers, sizes = read_annotations(annotations)
    groups = read_patients(patients) if patients is not None else {}
    check_prepared(out, settings, inputs, overwrite, hint)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "settings.json", json.dumps({**settings.to_dict(), "inputs": inputs.to_dict()},
                                                        indent=1) + "\n")
    ids = sorted(readers)[:max_images] if max_images else sorted(readers)
    warnings: list[str] = []
    without = _films_without_patient(ids, groups, patients, warnings) if patients is not None else None
    found = find_images(inputs.images, ids)
    failures: list[Failure] = []
    jobs = []
    metas: dict[str, dict[str, Any]] = {}
    for image_id in ids:
        meta_file = out / "meta" / f"{image_id}.json"
        if meta_file.is_file():
            metas[image_id] = json.loads(meta_file.read_text())
            continue
        if image_id not in found:
            failures.append(Failure(str(Path(inputs.images) / image_id), "detector-prepare", "no image file for "
                                    "this image_id (.dicom, .dcm, .png, .jpg)", "InputError"))
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
    outside: dict[str, Counter] = {s: Counter({"clipped": 0, "dropped": 0}) for s in SPLITS}
    for m in metas.values():
        per_class[m["split"]].update(b["class_name"] for b in m["boxes"])
        outside[m["split"]].update(m.get("outside", {}))
    atomic_write_text(out / "data.yaml", dataset_yaml(out, classes))
    _check_outside(out, per_class, outside, warnings)
    return PreparedData(out, classes, {s: counts.get(s, 0) for s in SPLITS},
                        {s: dict(sorted(per_class[s].items())) for s in SPLITS}, len(failures),
                        sha256_bytes(manifest.encode()), inputs.annotations_sha256, settings, inputs,
                        {s: dict(outside[s]) for s in SPLITS}, without, [f.to_dict() for f in failures], warnings)


def check_prepared(folder: Path, settings: PrepareSettings, inputs: PreparedInputs, overwrite: bool,
                   hint: str) -> None:
    """Refuse (or with ``overwrite`` clear) a prepared ``folder`` made from other settings or inputs."""
    recorded = read_prepared_settings(folder)
    if recorded is None:
        return
    changes = prepared_changes(recorded, settings, inputs)
    if not changes:
        return
    if not overwrite:
        raise ConfigError(f"{folder} was prepared from other inputs or settings ({'; '.join(changes)}); {hint}")
    _clear_prepared(folder)


def _films_without_patient(ids: Sequence[str], groups: dict[str, str], patients: str | Path,
                           warnings: list[str]) -> int:
    """How many annotated films the patients file gives no patient id (none matching at all is an error)."""
    missing = [i for i in ids if i not in groups]
    if ids and len(missing) == len(ids):
        example = next(iter(groups), "")
        raise InputError(f"none of the {len(ids)} annotated films has a patient id here (its image_id values look "
                         f"like {example!r}, the annotations' like {ids[0]!r}): image_id must be the annotations' "
                         "image_id, without a file suffix", patients)
    if missing:
        warnings.append(f"{len(missing)} of {len(ids)} annotated films have no patient id in {patients} (e.g. "
                        f"{missing[0]!r}): each of them is split as a patient of its own")
    return len(missing)


def _check_outside(folder: Path, per_class: dict[str, Counter], outside: dict[str, Counter],
                   warnings: list[str]) -> None:
    """Refuse when more than :data:`OUTSIDE_LIMIT` of the boxes lie outside their film; warn when any do."""
    clipped = sum(c["clipped"] for c in outside.values())
    dropped = sum(c["dropped"] for c in outside.values())
    total = sum(sum(c.values()) for c in per_class.values()) + dropped
    if not clipped + dropped:
        return
    text = (f"{clipped + dropped} of {total} boxes lie outside their film ({clipped} clipped to it, {dropped} "
            "dropped): are the coordinates in the pixels of the original DICOM while the films are resized copies? "
            "then add width and height columns with the original size")
    if clipped + dropped > OUTSIDE_LIMIT * total:
        raise ConfigError(f"{folder}: {text} (then rerun with --overwrite; per film: 'outside' in meta/*.json)")
    warnings.append(text)


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
