"""``cxrground ils export``: the request (one option per field) and its dispatch to the export formats.

``mimic-ils`` (the dataset with its masks in a frame, :mod:`cxrground.ils.frames`), ``hf``
(:mod:`cxrground.ils.export_hf`), ``coco`` (:mod:`cxrground.ils.export_coco`), ``dicom-seg``
(:mod:`cxrground.ils.export_dicom_seg`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cxrground.errors import ConfigError
from cxrground.extras import Need, check_needs
from cxrground.fields import option
from cxrground.ils.frames import RELEASED_SIZE, export_dataset
from cxrground.ils.layout import DATASET_HELP

__all__ = ["EXPORT_FORMATS", "ExportRequest", "export_request"]


#: Formats ``ils export`` writes: the dataset itself with its masks in a frame, a Hugging Face dataset, COCO
#: instance annotations, DICOM Segmentation objects.
EXPORT_FORMATS: Final[tuple[str, ...]] = ("mimic-ils", "hf", "coco", "dicom-seg")


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    """A dataset to write again in another format or mask frame (each field documents itself,
    :func:`cxrground.fields.option`; ``cxrground ils export`` offers one option per field)."""

    format: str = option("mimic-ils", choices=EXPORT_FORMATS, help="mimic-ils: the same JSON with the masks in "
                         "--frame; hf: Hugging Face Parquet shards + dataset card (needs --images); coco: COCO "
                         "instance annotations (RLE masks) + a pair side file; dicom-seg: one DICOM Segmentation "
                         "per study read from DICOM (needs --images).")
    frame: str = option("released", choices=("released", "native"), help="mimic-ils format: released: 512x512 "
                        "masks, the whole image stretched to the square (MIMIC-ILS as published, what the ROSALIA "
                        "code trains on); native: each image's own size.")
    dataset: Path = option(path="existing", help=DATASET_HELP)
    out: Path = option(path="out_dir", help="Folder to write: empty or new, or an earlier export of the same format "
                       "with --overwrite.")
    overwrite: bool = option(False, help="Replace an earlier export in --out (a --out holding files is refused "
                             "otherwise; one holding files no export of --format writes is always refused).")
    size: int = option(RELEASED_SIZE, low=1, help="Side of the released-frame masks.")
    images: Path | None = option(None, path="dir", help="Image root the dataset's image_path values are relative "
                                 "to: native sizes the dataset does not record (e.g. a downloaded MIMIC-ILS), the "
                                 "images of the hf format, the DICOM sources of dicom-seg.")
    shard_rows: int = option(500, low=1, help="hf format: rows per Parquet shard.")
    arrow: bool = option(False, help="hf format: also write arrow/ (datasets.save_to_disk) for load_from_disk.")
    hf_rows: str = option("pair", choices=("pair", "study"), help="hf format: one row per instruction-answer pair "
                          "(the study image repeated on each) or one per study (its pairs as a list).")


def export_request(request: ExportRequest) -> str:
    """The export ``request`` asks for (native sizes read from the images under ``request.images`` when given);
    returns what was written, as one line. Every format writes its folder through
    :func:`cxrground.io.export_dir.export_folder` (refused when not empty unless ``overwrite``; moved into place
    only when complete)."""
    from cxrground.io.image import read_image

    r = request
    folder = r.dataset if r.dataset.is_dir() else r.dataset.parent
    if r.out.resolve() == folder.resolve():
        raise ConfigError(f"--out {r.out} is the dataset's own folder; export to another folder")
    if r.format in ("hf", "dicom-seg") and r.images is None:
        raise ConfigError(f"--format {r.format} needs --images (the image root of the dataset)")
    needs = {"hf": ("datasets",), "dicom-seg": ("highdicom",)}.get(r.format)
    if needs:  # before any study is read
        check_needs([Need(f"--format {r.format}", needs)], f"ils export --format {r.format}")
    if r.format == "hf":
        from cxrground.ils.export_hf import export_hf

        s = export_hf(r.dataset, r.images, r.out, shard_rows=r.shard_rows, arrow=r.arrow, rows=r.hf_rows,
                      overwrite=r.overwrite)
        parts = ", ".join(f"{k}: {v['num_examples']}" for k, v in s["splits"].items())
        return f"{r.out}: Hugging Face dataset, {s['rows']} {r.hf_rows} rows ({parts}), README.md dataset card"
    if r.format == "coco":
        from cxrground.ils.export_coco import export_coco

        c = export_coco(r.dataset, r.out, images=r.images, overwrite=r.overwrite)
        empty = f" ({c['empty_masks']} empty masks have none)" if c["empty_masks"] else ""
        return (f"{r.out}: COCO, {c['images']} images, {c['annotations']} lesion annotations{empty}, {c['pairs']} "
                f"pairs in the side file")
    if r.format == "dicom-seg":
        from cxrground.ils.export_dicom_seg import export_dicom_seg

        d = export_dicom_seg(r.dataset, r.images, r.out, overwrite=r.overwrite)
        return (f"{r.out}: {d['written']} DICOM Segmentation objects ({d['segments']} segments), "
                f"{len(d['skipped'])} studies skipped (see {d['record']})")
    sizes = None if r.images is None else (lambda rel: read_image(r.images / rel).shape)
    counts = export_dataset(r.dataset, r.out, frame=r.frame, size=r.size, image_size=sizes, overwrite=r.overwrite)
    line = (f"{r.out}: {counts['masks']} masks in the {r.frame} frame, {counts['studies']} studies "
            f"({counts['native_sizes']} native sizes recorded)")
    return line if counts["warning"] is None else f"{line}\nwarning: {counts['warning']}"
