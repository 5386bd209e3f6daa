"""``cxrground ils export --format dicom-seg``: the lesion masks of DICOM studies as DICOM Segmentation objects.

For every study whose image (under ``images``) is a DICOM file, one binary Segmentation instance is written
through highdicom: ``{study_key}.seg.dcm``, referencing the source SOP instance (its Study, patient and frame
attributes come from the source), one segment per lesion mask file of the study (in the order of its positive
pairs), labelled by the mask's name (``pneumonia_0``), with the coded concepts of
:mod:`cxrground.vocab.codes` (type: the lesion; category: morphologically abnormal structure) and the algorithm
``cxrground`` (family: artificial intelligence; type AUTOMATIC). Masks are written on the source's pixel grid
(a released-frame mask is mapped back with :func:`cxrground.ils.frames.to_native`; without a frame record, a
square 512 mask on a film of another size is one, :func:`cxrground.ils.frames.is_released`), with the source's pixel
spacing (:func:`pixel_measures`: PixelSpacing, else ImagerPixelSpacing, the spacing at the detector; a source
without SliceThickness gets the nominal :data:`SLICE_THICKNESS_MM`, which readers require of a Segmentation and a
projection radiograph does not have; a source with no spacing gives a Segmentation without one).

Repeatable: the Series, SOP Instance and Dimension Organization UIDs are derived
(:func:`pydicom.uid.generate_uid` with entropy sources) from the source's SOP Instance and Series UIDs, the
segments (label, lesion, pair ids), the mask pixels and the toolkit version, and the content and instance
creation date and time are the source's content, acquisition or study date and time (the first it has; else
:data:`FALLBACK_DATETIME`), so exporting the same dataset again writes the same bytes (a PACS receiving them again
sees the same instances).

Studies are never dropped silently: ``dicom_seg.jsonl`` has one line per study, ``status`` ``written`` (with
the file, the source SOP Instance UID and the segments: number, label, lesion, mask path, pair ids) or
``skipped`` with the reason (image not DICOM, no lesion mask, unreadable source or mask file, naming the file,
mask size ≠ image size; a source without the Part-10 header is read when its pixel data decodes); a dataset
none of whose studies could be written is an error. Type-2
patient/study attributes the source lacks (PatientID, StudyDate, ...) are given empty values on the in-memory
copy highdicom reads (the source file is not touched). OHIF and 3D Slicer (QuantitativeReporting) open the
objects beside their source image.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground import __version__
from cxrground.errors import ConfigError, CXRGroundError, InputError
from cxrground.ils.frames import MaskFrame, is_released, read_frame, to_native
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import check_splits, iter_dataset
from cxrground.io.export_dir import export_folder
from cxrground.io.image import is_dicom
from cxrground.io.masks import read_mask_png
from cxrground.vocab.codes import LESION_CATEGORY, LESION_CODES

__all__ = ["FALLBACK_DATETIME", "RECORD_FILE", "SEG_NAMES", "SEG_SUFFIX", "SLICE_THICKNESS_MM", "export_dicom_seg",
           "pixel_measures", "study_segmentation"]

RECORD_FILE: Final[str] = "dicom_seg.jsonl"
SEG_SUFFIX: Final[str] = ".seg.dcm"
#: What a dicom-seg export writes at its top (what ``overwrite`` may replace).
SEG_NAMES: Final[tuple[str, ...]] = (RECORD_FILE, f"*{SEG_SUFFIX}")
#: Slice Thickness (mm) of the Pixel Measures when the source has none: a projection radiograph has no slice, but
#: readers (``highdicom.seg.segread``) require the attribute; a nominal 1 mm stands in.
SLICE_THICKNESS_MM: Final[float] = 1.0
#: Content / instance creation date and time of a Segmentation whose source has no date (DICOM DA, TM).
FALLBACK_DATETIME: Final[tuple[str, str]] = ("19700101", "000000")
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


def pixel_measures(source: Any) -> Any | None:
    """The Pixel Measures of a Segmentation of ``source``: its PixelSpacing, else its ImagerPixelSpacing, with its
    SliceThickness, else :data:`SLICE_THICKNESS_MM`; None when the source gives no spacing."""
    hd = _highdicom()
    spacing = source.get("PixelSpacing") or source.get("ImagerPixelSpacing")
    if not spacing:
        return None
    thickness = source.get("SliceThickness")
    return hd.PixelMeasuresSequence(pixel_spacing=[float(v) for v in spacing],
                                    slice_thickness=float(thickness) if thickness else SLICE_THICKNESS_MM)


def _uid(seed: list[str], role: str) -> str:
    from pydicom.uid import generate_uid

    return str(generate_uid(entropy_srcs=[*seed, role]))


def _stable_datetime(source: Any) -> tuple[str, str]:
    """The source's content, acquisition or study date and time (the first with a date), else
    :data:`FALLBACK_DATETIME`."""
    for date, time in (("ContentDate", "ContentTime"), ("AcquisitionDate", "AcquisitionTime"),
                       ("StudyDate", "StudyTime")):
        if source.get(date):
            return str(source.get(date)), str(source.get(time) or "000000")
    return FALLBACK_DATETIME


def _make_repeatable(seg: Any, source: Any, seed: list[str]) -> None:
    """Give ``seg`` the dimension organization UID derived from ``seed`` and the dates and times of the source
    (:func:`_stable_datetime`) in place of the ones highdicom draws and reads from the clock."""
    dimension = _uid(seed, "dimension-organization")
    for item in (*seg.DimensionOrganizationSequence, *seg.DimensionIndexSequence):
        item.DimensionOrganizationUID = dimension
    date, time = _stable_datetime(source)
    for name in ("ContentDate", "InstanceCreationDate", "SeriesDate"):
        if name in seg:
            setattr(seg, name, date)
    for name in ("ContentTime", "InstanceCreationTime", "SeriesTime"):
        if name in seg:
            setattr(seg, name, time)
    for item in seg.get("ContributingEquipmentSequence", []):
        if "ContributionDateTime" in item:
            item.ContributionDateTime = date + time


def study_segmentation(source: Any, masks: list[np.ndarray], segments: list[dict[str, Any]]) -> Any:
    """A highdicom binary Segmentation of ``source`` (a pydicom dataset) with one segment per mask; its UIDs,
    dates and times depend on the source, the segments, the masks and the toolkit version only (module
    docstring)."""
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
    seed = ["cxrground ils dicom-seg", __version__, str(source.SOPInstanceUID), str(source.SeriesInstanceUID),
            *(f"{s['label']}:{s['lesion']}:{','.join(s.get('pair_ids', []))}" for s in segments),
            hashlib.sha256(np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()).hexdigest()]
    seg = hd.seg.Segmentation(
        source_images=[source], pixel_array=pixels, segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=descriptions, series_instance_uid=_uid(seed, "series"), series_number=9100,
        sop_instance_uid=_uid(seed, "instance"), instance_number=1, manufacturer="cxrground",
        manufacturer_model_name="cxrground ils", software_versions=__version__, device_serial_number="cxrground",
        series_description="ILS lesion masks", pixel_measures=pixel_measures(source))
    _make_repeatable(seg, source, seed)
    return seg


#: Transfer syntax of a dataset read without its file meta, by its encoding ``(implicit VR, little endian)``.
_SYNTAX: Final[dict[tuple[bool, bool], str]] = {(True, True): "1.2.840.10008.1.2", (False, True): "1.2.840.10008.1.2.1",
                                                (False, False): "1.2.840.10008.1.2.2"}


def _source(path: Path) -> Any:
    """The source DICOM at ``path`` with the type-2 attributes highdicom requires; a file without the Part-10
    header (preamble, ``DICM``, file meta) is read as a bare dataset when it holds an image whose pixel data
    decodes. Anything else is an :class:`InputError` naming the file."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        ds = pydicom.dcmread(path)
    except InvalidDicomError:
        ds = _bare_dataset(path)
    except Exception as exc:  # pydicom raises many types on truncated files
        raise InputError(f"cannot parse DICOM ({type(exc).__name__}: {exc})", path) from exc
    for name in _TYPE2:
        if name not in ds:
            setattr(ds, name, "")
    return ds


def _bare_dataset(path: Path) -> Any:
    """A DICOM dataset stored without the Part-10 header, given the file meta of its encoding; an
    :class:`InputError` naming the file when it is not one or its pixel data does not decode."""
    import pydicom
    from pydicom.dataset import FileMetaDataset

    reason = "not a DICOM file (no Part-10 header: preamble and 'DICM')"
    try:
        ds = pydicom.dcmread(path, force=True)
        encoding = ds.original_encoding
    except Exception as exc:
        raise InputError(f"{reason} ({type(exc).__name__}: {exc})", path) from exc
    if "SOPInstanceUID" not in ds or "PixelData" not in ds or encoding not in _SYNTAX:
        raise InputError(f"{reason}, and read without one it holds no image", path)
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = _SYNTAX[encoding]
    ds.file_meta.MediaStorageSOPClassUID = ds.get("SOPClassUID", "")
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    try:
        ds.pixel_array  # noqa: B018  (decodes, or raises)
    except Exception as exc:
        raise InputError(f"{reason}, and read without one its pixel data does not decode "
                         f"({type(exc).__name__}: {exc})", path) from exc
    return ds


def _one(key: str, study: dict[str, Any], images: Path, mask_root: Path, frame: MaskFrame, out: Path
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
    except InputError as exc:
        return {"status": "skipped", "reason": str(exc)}
    try:
        hw = (int(source.Rows), int(source.Columns))
        masks = []
        for s in segments:
            mask = read_mask_png(mask_root / s["seg_mask_path"])
            if mask.shape != hw and not is_released(mask.shape, hw, frame):
                return {"status": "skipped", "reason": f"mask {s['seg_mask_path']} is {mask.shape}, the "
                                                       f"DICOM image {hw}"}
            masks.append(to_native(mask, hw))
        seg = study_segmentation(source, masks, segments)
    except (CXRGroundError, OSError, ValueError, AttributeError, TypeError) as exc:
        return {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
    path = out / f"{key}{SEG_SUFFIX}"
    seg.save_as(path)
    return {"status": "written", "file": path.name, "source_sop_instance_uid": str(source.SOPInstanceUID),
            "segmentation_sop_instance_uid": str(seg.SOPInstanceUID), "segments": segments}


def export_dicom_seg(dataset: str | Path, images: str | Path, out: str | Path, *, overwrite: bool = False
                     ) -> dict[str, Any]:
    """Write one Segmentation per DICOM study of ``dataset`` into ``out`` and the study record
    (module docstring); returns ``{written, segments, skipped: [(study_key, reason)], record}``. ``out`` must be
    empty or, with ``overwrite``, hold an earlier dicom-seg export, which is replaced
    (:mod:`cxrground.io.export_dir`); a dataset with studies of which none could be written is an
    :class:`InputError` listing why (``out`` is then left as it was)."""
    _highdicom()
    dataset, images, out = Path(dataset), Path(images), Path(out)
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    check_splits(json_path)
    mask_root = json_path.parent / MASK_DIR
    frame = read_frame(json_path)
    with export_folder(out, overwrite, SEG_NAMES, "dicom-seg") as stage, \
            (stage / RECORD_FILE).open("w", encoding="utf-8") as record:
        skipped = []
        written = n_segments = 0
        for split, key, study in iter_dataset(json_path):
            rec = {"study_key": key, "split": split, "image_path": study["image_path"],
                   **_one(key, study, images, mask_root, frame, stage)}
            if rec["status"] == "written":
                written += 1
                n_segments += len(rec["segments"])
            else:
                skipped.append((key, rec["reason"]))
            record.write(json.dumps(rec, ensure_ascii=False) + "\n")
        if skipped and not written:
            raise InputError(f"no DICOM Segmentation written: every study was skipped ({_reasons(skipped)})",
                             json_path)
    return {"written": written, "segments": n_segments, "skipped": skipped, "record": str(out / RECORD_FILE)}


def _reasons(skipped: list[tuple[str, str]], shown: int = 3) -> str:
    """The first ``shown`` skipped studies with their reasons, and how many more there are."""
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return "; ".join(f"{key}: {reason}" for key, reason in skipped[:shown]) + more
