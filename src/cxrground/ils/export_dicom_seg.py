"""``cxrground ils export --format dicom-seg``: the lesion masks of DICOM studies as DICOM Segmentation objects.

For every study whose image (under ``images``) is a DICOM file, one binary Segmentation instance is written
through highdicom: ``{study_key}.seg.dcm``, referencing the source SOP instance (its Study, patient and frame
attributes come from the source), one segment per lesion mask file of the study (in the order of its positive
pairs), labelled by the mask's name (``pneumonia_0``), with the coded concepts of
:mod:`cxrground.vocab.codes` (type: the lesion; category: morphologically abnormal structure) and the algorithm
``cxrground`` (family: artificial intelligence; type AUTOMATIC). Masks are written on the source's pixel grid
(a released-frame dataset is mapped back with :func:`cxrground.ils.frames.to_native`).

Studies are never dropped silently: ``dicom_seg.jsonl`` has one line per study, ``status`` ``written`` (with
the file, the source SOP Instance UID and the segments: number, label, lesion, mask path, pair ids) or
``skipped`` with the reason (image not DICOM, no lesion mask, unreadable source, mask size ≠ image size). Type-2
patient/study attributes the source lacks (PatientID, StudyDate, ...) are given empty values on the in-memory
copy highdicom reads (the source file is not touched). OHIF and 3D Slicer (QuantitativeReporting) open the
objects beside their source image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground import __version__
from cxrground.errors import ConfigError, CXRGroundError
from cxrground.ils.frames import read_frame, to_native
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import SPLITS, read_dataset
from cxrground.io.image import is_dicom
from cxrground.io.masks import read_mask_png
from cxrground.vocab.codes import LESION_CATEGORY, LESION_CODES

__all__ = ["RECORD_FILE", "SEG_SUFFIX", "export_dicom_seg", "study_segmentation"]

RECORD_FILE: Final[str] = "dicom_seg.jsonl"
SEG_SUFFIX: Final[str] = ".seg.dcm"
#: Type-2 attributes highdicom copies from the source (empty values stand in for absent ones).
_TYPE2: Final[tuple[str, ...]] = ("PatientID", "PatientName", "PatientBirthDate", "PatientSex", "StudyID",
                                  "StudyDate", "StudyTime", "ReferringPhysicianName", "AccessionNumber")


def _highdicom() -> Any:
    try:
        import highdicom
    except ImportError as exc:  # pragma: no cover - the export extra is installed in the tests
        raise ConfigError("the dicom-seg export needs highdicom: pip install 'cxrground[export]'") from exc
    return highdicom


def _segments(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One segment per distinct mask file, in positive-pair order: label, lesion, mask path, pair ids."""
    by_mask: dict[str, dict[str, Any]] = {}
    for pair in study["instruction_answer_pairs"].get("positive_pairs", []):
        rel = pair["seg_mask_path"]
        seg = by_mask.setdefault(rel, {"label": Path(rel).stem.split("_", 1)[-1], "lesion": pair["target"],
                                       "seg_mask_path": rel, "pair_ids": []})
        seg["pair_ids"].append(pair["pair_id"])
    return [{"number": i, **s} for i, s in enumerate(by_mask.values(), start=1)]


def study_segmentation(source: Any, masks: list[np.ndarray], segments: list[dict[str, Any]]) -> Any:
    """A highdicom binary Segmentation of ``source`` (a pydicom dataset) with one segment per mask."""
    hd = _highdicom()
    from pydicom.sr.codedict import codes

    algorithm = hd.AlgorithmIdentificationSequence(name="cxrground", version=__version__,
                                                   family=codes.cid7162.ArtificialIntelligence)
    category = hd.sr.CodedConcept(LESION_CATEGORY[1], LESION_CATEGORY[0], LESION_CATEGORY[2])
    descriptions = []
    for s in segments:
        scheme, value, meaning = LESION_CODES[s["lesion"]]
        descriptions.append(hd.seg.SegmentDescription(
            segment_number=s["number"], segment_label=s["label"], segmented_property_category=category,
            segmented_property_type=hd.sr.CodedConcept(value, scheme, meaning),
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm_identification=algorithm))
    pixels = np.stack(masks, axis=-1)[None]  # (1 frame, rows, columns, segments)
    return hd.seg.Segmentation(
        source_images=[source], pixel_array=pixels, segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=descriptions, series_instance_uid=hd.UID(), series_number=9100,
        sop_instance_uid=hd.UID(), instance_number=1, manufacturer="cxrground",
        manufacturer_model_name="cxrground ils", software_versions=__version__, device_serial_number="cxrground",
        series_description="ILS lesion masks")


def _source(path: Path) -> Any:
    import pydicom

    ds = pydicom.dcmread(path)
    for name in _TYPE2:
        if name not in ds:
            setattr(ds, name, "")
    return ds


def _one(key: str, study: dict[str, Any], images: Path, mask_root: Path, released: bool, out: Path
         ) -> dict[str, Any]:
    """Write the Segmentation of one study; returns its record line (written or skipped with the reason)."""
    image = images / study["image_path"]
    if not image.is_file():
        return {"status": "skipped", "reason": f"image not found: {image}"}
    if not is_dicom(image):
        return {"status": "skipped", "reason": f"image is not DICOM ({image.suffix or 'no suffix'}): no SOP "
                                               "instance to reference"}
    segments = _segments(study)
    if not segments:
        return {"status": "skipped", "reason": "no lesion mask (negative pairs only)"}
    try:
        source = _source(image)
        hw = (int(source.Rows), int(source.Columns))
        masks = []
        for s in segments:
            mask = read_mask_png(mask_root / s["seg_mask_path"])
            if mask.shape != hw:
                if not released:
                    return {"status": "skipped", "reason": f"mask {s['seg_mask_path']} is {mask.shape}, the "
                                                           f"DICOM image {hw}"}
                mask = to_native(mask, hw)
            masks.append(mask)
        seg = study_segmentation(source, masks, segments)
    except (CXRGroundError, OSError, ValueError, AttributeError, TypeError) as exc:
        return {"status": "skipped", "reason": f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"}
    path = out / f"{key}{SEG_SUFFIX}"
    seg.save_as(path)
    return {"status": "written", "file": path.name, "source_sop_instance_uid": str(source.SOPInstanceUID),
            "segmentation_sop_instance_uid": str(seg.SOPInstanceUID), "segments": segments}


def export_dicom_seg(dataset: str | Path, images: str | Path, out: str | Path) -> dict[str, Any]:
    """Write one Segmentation per DICOM study of ``dataset`` into ``out`` and the study record
    (module docstring); returns ``{written, segments, skipped: [(study_key, reason)], record}``."""
    _highdicom()
    dataset, images, out = Path(dataset), Path(images), Path(out)
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    data = read_dataset(json_path)
    mask_root = json_path.parent / MASK_DIR
    released = read_frame(json_path).frame == "released"
    out.mkdir(parents=True, exist_ok=True)
    lines, skipped = [], []
    written = n_segments = 0
    for split in SPLITS:
        for key, study in data.get(split, {}).items():
            rec = {"study_key": key, "split": split, "image_path": study["image_path"],
                   **_one(key, study, images, mask_root, released, out)}
            if rec["status"] == "written":
                written += 1
                n_segments += len(rec["segments"])
            else:
                skipped.append((key, rec["reason"]))
            lines.append(json.dumps(rec, ensure_ascii=False))
    record = out / RECORD_FILE
    record.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return {"written": written, "segments": n_segments, "skipped": skipped, "record": str(record)}
