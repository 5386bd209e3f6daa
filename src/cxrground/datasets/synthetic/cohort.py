"""Writing, resuming, loading and summarising a synthetic cohort on disk (MIMIC-CXR-JPG-like layout).

```
DIR/README.md                 synthetic test data, seed, generator version, conventions
DIR/cohort.json               generator, version, seed, n_studies, config, file counts
DIR/index.csv                 subject_id,study_id,dicom_id,view,image_path,report_path,height,width
DIR/mimic-cxr-2.0.0-metadata.csv.gz   dicom_id,subject_id,study_id,ViewPosition,Rows,Columns (MIMIC-CXR-JPG's)
DIR/files/p1X/p1XXXXXXX/s5XXXXXXX/<dicom_id>.jpg   image (or .png)
DIR/files/p1X/p1XXXXXXX/s5XXXXXXX.txt              report (MIMIC layout)
DIR/truth/s5XXXXXXX.json      ground truth, written last and atomically (study complete iff present)
DIR/masks/s5XXXXXXX/{right_lung,left_lung,heart}.png, lesion_{k}_{lesion}.png   0/255, native size
DIR/preview.png               contact sheet of the first (up to) 16 studies with lesion masks
```
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from pydantic import ValidationError
from scipy import ndimage

from cxrground.datasets.synthetic.config import GENERATOR_NAME, GENERATOR_VERSION, SynthConfig
from cxrground.datasets.synthetic.records import StudyTruth
from cxrground.datasets.synthetic.study import SyntheticStudy, generate_study, study_ids
from cxrground.datasets.views import VIEW_TABLE_NAMES
from cxrground.errors import ConfigError, InputError
from cxrground.fields import option
from cxrground.io.files import atomic_write_bytes
from cxrground.io.masks import decode_rle, write_mask_png
from cxrground.io.output_lock import locks_output
from cxrground.vocab import LESIONS
from cxrground.vocab.lesions import ABBREVIATIONS
from cxrground.vocab.traits import LESION_TRAITS

INDEX_COLUMNS: Final[tuple[str, ...]] = (
    "subject_id", "study_id", "dicom_id", "view", "image_path", "report_path", "height", "width",
)
PREVIEW_STUDIES: Final[int] = 16
PREVIEW_TILE: Final[int] = 256
#: Overlay colour of each lesion in preview.png (RGB): the ``colour`` trait.
LESION_COLORS: Final[dict[str, tuple[int, int, int]]] = {name: t.colour for name, t in LESION_TRAITS.items()}


@dataclass
class CohortSummary:
    """What :func:`write_cohort` did and what the folder holds now."""

    out_dir: str
    seed: int
    n_requested: int
    n_generated: int
    n_skipped: int
    n_studies: int
    files: dict[str, int] = field(default_factory=dict)
    lesions: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> list[str]:
        """What was generated and which files the folder holds, as lines (``cxrground synth``)."""
        f, out = self.files, Path(self.out_dir)
        present = ", ".join(f"{k} {v['present']}" for k, v in self.lesions.items())
        kept = self.n_studies - self.n_requested
        return [f"synthetic cohort (TEST DATA) in {self.out_dir}: {self.n_studies} "
                f"{'study' if self.n_studies == 1 else 'studies'} (generated "
                f"{self.n_generated}, skipped {self.n_skipped} existing) in {self.seconds:.1f} s, seed {self.seed}",
                *([f"  {kept} studies beyond the {self.n_requested} asked for were there and are kept (synth "
                   "removes none; use a new folder for a smaller cohort)"] if kept > 0 else []),
                f"  files: {f['images']} images, {f['reports']} reports, {f['truth']} truth records, "
                f"{f['anatomy_masks']} anatomy masks, {f['lesion_masks']} lesion masks",
                f"  lesions present: {present}",
                *(f"  {out / name}" for name in ("index.csv", VIEW_TABLE_NAMES[0], "cohort.json", "README.md",
                                                 "preview.png"))]


# --- file writing ---------------------------------------------------------------------------------

def _image_bytes(image: np.ndarray, fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(image)
    if fmt == "jpg":
        im.save(buf, format="JPEG", quality=int(quality), optimize=False)
    else:
        im.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def truth_json(truth: StudyTruth) -> str:
    """The canonical JSON text of a truth record (stable key order, trailing newline)."""
    return json.dumps(truth.to_dict(), indent=1, ensure_ascii=False) + "\n"


def write_study(out_dir: str | Path, study: SyntheticStudy, config: SynthConfig) -> Path:
    """Write one study's image, report and masks, then its truth file (last, atomically)."""
    out = Path(out_dir)
    t = study.truth
    atomic_write_bytes(out / t.image_path, _image_bytes(study.image, config.format, config.jpeg_quality))
    atomic_write_bytes(out / t.report_path, study.report.encode("utf-8"))
    for name, mask in study.anatomy_masks.items():
        write_mask_png(out / t.anatomy[name].path, mask)
    for f in t.findings:
        if f.mask is not None and f.mask_index is not None:
            write_mask_png(out / f.mask.path, study.lesion_masks[f.mask_index])
    path = out / f"truth/{t.study_id}.json"
    atomic_write_bytes(path, truth_json(t).encode("utf-8"))
    return path


# --- loading --------------------------------------------------------------------------------------

def read_truth(path: str | Path) -> StudyTruth:
    """Read one ``truth/s5XXXXXXX.json``; an :class:`~cxrground.errors.InputError` naming the file when it cannot
    be read or is not a truth record."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"truth record cannot be read ({exc.strerror or exc})", path) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"truth record is not JSON ({exc})", path) from exc
    try:
        return StudyTruth.from_dict(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the record"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise InputError(f"not a synthetic truth record: {where}: {first['msg']}{more}", path) from exc


def load_truth(out_dir: str | Path) -> list[StudyTruth]:
    """All truth records of a cohort folder, ordered by ``(seed, index)``; an
    :class:`~cxrground.errors.InputError` naming the folder when it has no ``truth/``, or the first record that
    cannot be read."""
    folder = Path(out_dir) / "truth"
    if not folder.is_dir():
        raise InputError("no truth/ folder: not a synthetic cohort (cxrground synth writes one)", out_dir)
    records = [read_truth(p) for p in sorted(folder.glob("s*.json"))]
    return sorted(records, key=lambda t: (t.seed, t.index))


def _study_files(out: Path, t: StudyTruth) -> list[Path]:
    paths = [out / t.image_path, out / t.report_path]
    paths += [out / m.path for m in t.anatomy.values()]
    paths += [out / f.mask.path for f in t.findings if f.mask is not None]
    return paths


def _remove_study(out: Path, t: StudyTruth) -> None:
    """Delete a stale study (its truth first, so a crash leaves it 'incomplete', never half-valid)."""
    (out / f"truth/{t.study_id}.json").unlink(missing_ok=True)
    for p in _study_files(out, t):
        p.unlink(missing_ok=True)
    for folder in (out / f"masks/{t.study_id}", (out / t.image_path).parent):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


# --- the cohort -----------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CohortRequest:
    """Where to write how many studies of which seed, image format and width (each field documents itself,
    :func:`cxrground.fields.option`; ``cxrground synth`` offers one option per field)."""

    out_dir: Path = option(flag="--out", path="out_dir",
                           help="Folder to write the cohort to: new, empty or a cohort to extend (a folder holding "
                                "other files is refused).")
    n_studies: int = option(24, flag="--studies", low=1, help="Number of studies (indices 0..N-1); a cohort "
                            "holding more keeps them.")
    seed: int = option(0, low=0, help="Cohort seed.")
    fmt: str = option("jpg", flag="--format", choices=("jpg", "png"), help="Image file format.")
    width: int = option(512, low=64, high=4096,
                        help="Image width in pixels; heights vary per study (0.875..1.125 x width).")
    overwrite: bool = option(False, help="Regenerate studies that already exist; studies of a cohort made with "
                             "other settings (seed, width, format) are deleted first.")


def write_requested_cohort(request: CohortRequest, progress: bool = True) -> CohortSummary:
    """:func:`write_cohort` with the request's folder, size, seed, image format and width."""
    return write_cohort(request.out_dir, request.n_studies, seed=request.seed,
                        config=SynthConfig(width=request.width, format=request.fmt), overwrite=request.overwrite,
                        progress=progress)


@locks_output("synth", "out_dir")
def write_cohort(
    out_dir: str | Path,
    n_studies: int,
    seed: int = 0,
    config: SynthConfig | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> CohortSummary:
    """Generate studies ``0..n_studies-1`` into ``out_dir`` and rebuild the index files.

    A study whose truth file exists (same seed and configuration) is skipped unless ``overwrite``.
    A folder that holds a cohort of another seed, configuration or generator version is refused
    (:class:`ConfigError`) unless ``overwrite``, which then deletes the foreign studies first.
    ``index.csv``, the view table, ``cohort.json``, ``README.md`` and ``preview.png`` are rebuilt from the truth
    files.
    """
    import time

    from cxrground.io.progress import progress_bar

    config = config or SynthConfig()
    if not isinstance(n_studies, int) or isinstance(n_studies, bool) or n_studies < 1:
        raise ConfigError(f"n_studies must be a positive integer, got {n_studies!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(out_dir)
    _check_not_foreign(out)
    out.mkdir(parents=True, exist_ok=True)
    chash = config.config_hash()
    started = time.perf_counter()

    try:
        existing = load_truth(out) if (out / "truth").is_dir() else []
    except InputError as exc:  # a record edited by hand or damaged on disk
        raise exc.with_reason(f"{exc.reason}; delete this file and rerun the command to write the study again") \
            from exc
    foreign = [t for t in existing if t.seed != seed or t.config_hash != chash]
    if foreign and not overwrite:
        raise ConfigError(
            f"{out} already holds {len(foreign)} synthetic studies of another cohort, made with other settings: "
            f"{_settings_differ(out, foreign[0], seed, config)}; give the cohort's settings to extend it, use another "
            "folder, or add --overwrite to delete those studies and write new ones"
        )
    for t in foreign:
        _remove_study(out, t)

    generated = skipped = 0
    bar = progress_bar(range(n_studies), desc="synth", unit="study", progress=progress, dynamic_ncols=True)
    for index in bar:
        ids = study_ids(seed, index)
        truth_path = out / ids.truth_path
        if truth_path.exists() and not overwrite:
            skipped += 1
            continue
        study = generate_study(seed, index, config)
        if truth_path.exists():  # overwrite: drop the old files first
            _remove_study(out, read_truth(truth_path))
        write_study(out, study, config)
        generated += 1
    bar.close()

    records = [t for t in load_truth(out) if t.seed == seed and t.config_hash == chash]
    counts = write_index_files(out, records, seed, config)
    stats = summarize_records(records)
    return CohortSummary(
        out_dir=str(out),
        seed=seed,
        n_requested=n_studies,
        n_generated=generated,
        n_skipped=skipped,
        n_studies=len(records),
        files=counts,
        lesions=stats["lesions"],
        seconds=round(time.perf_counter() - started, 3),
    )


#: The ``synth`` option of each configuration field that has one.
_FLAGS = {"width": "--width", "format": "--format"}


def _settings_differ(out: Path, existing: StudyTruth, seed: int, config: SynthConfig) -> str:
    """Which requested settings differ from those of the cohort in ``out`` (``existing``: one of its studies), each
    as ``--seed 4 (the cohort's: 3)``: the seed, each configuration field (from its ``cohort.json``) and the
    generator version."""
    parts = [f"--seed {seed} (the cohort's: {existing.seed})"] if existing.seed != seed else []
    theirs: object = None
    try:
        meta = json.loads((out / "cohort.json").read_text(encoding="utf-8"))
        if isinstance(meta, dict) and meta.get("config_hash") == existing.config_hash:
            theirs = meta.get("config")
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    mine = json.loads(json.dumps(config.to_dict()))
    if isinstance(theirs, dict):
        parts += [f"{_FLAGS.get(k, k)} {v} (the cohort's: {theirs.get(k)})" for k, v in mine.items()
                  if theirs.get(k) != v]
    if existing.generator_version != GENERATOR_VERSION:
        parts.append(f"generator {GENERATOR_VERSION} (the cohort's: {existing.generator_version})")
    if not parts and existing.config_hash != config.config_hash():
        parts.append(f"settings {config.config_hash()} (the cohort's: {existing.config_hash})")
    return ", ".join(parts)


#: Folders a study's files go to; a folder holding only these is a cohort cut short before its index files.
_STUDY_DIRS = ("files", "masks", "truth")


def _check_not_foreign(out: Path) -> None:
    """A :class:`ConfigError` when ``out`` holds files but no synthetic cohort (no ``cohort.json``, no ``truth/``):
    the cohort would write its ``README.md``, ``index.csv`` and ``preview.png`` over what is there."""
    if not out.is_dir() or (out / "cohort.json").is_file() or (out / "truth").is_dir():
        return
    other = sorted(p.name for p in out.iterdir() if p.name not in _STUDY_DIRS and not p.name.startswith("."))
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise ConfigError(f"{out} is not empty ({shown}) and holds no synthetic cohort; write the cohort to a new or "
                          "empty folder")


def view_table_bytes(records: Iterable[StudyTruth]) -> bytes:
    """The cohort's views as MIMIC-CXR-JPG ships them (``mimic-cxr-2.0.0-metadata.csv.gz``: ``dicom_id``,
    ``subject_id``, ``study_id`` as numbers, ``ViewPosition``, ``Rows``, ``Columns``), gzipped without a time stamp
    so that a cohort stays byte-identical."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["dicom_id", "subject_id", "study_id", "ViewPosition", "Rows", "Columns"])
    for t in records:
        writer.writerow([t.dicom_id, t.subject_id.lstrip("p"), t.study_id.lstrip("s"), t.view, t.height, t.width])
    return gzip.compress(buf.getvalue().encode("utf-8"), mtime=0)


def write_index_files(out: Path, records: list[StudyTruth], seed: int, config: SynthConfig) -> dict[str, int]:
    """Rebuild ``index.csv``, the view table, ``cohort.json``, ``README.md`` and ``preview.png``; return file
    counts."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(INDEX_COLUMNS)
    for t in records:
        writer.writerow([t.subject_id, t.study_id, t.dicom_id, t.view, t.image_path, t.report_path,
                         t.height, t.width])
    atomic_write_bytes(out / "index.csv", buf.getvalue().encode("utf-8"))
    atomic_write_bytes(out / VIEW_TABLE_NAMES[0], view_table_bytes(records))
    counts = {
        "images": len(records),
        "reports": len(records),
        "truth": len(records),
        "anatomy_masks": sum(len(t.anatomy) for t in records),
        "lesion_masks": sum(1 for t in records for f in t.findings if f.mask is not None),
    }
    counts["total"] = sum(counts.values()) + 5  # + README, cohort.json, index.csv, view table, preview.png
    stats = summarize_records(records)
    cohort = {
        "generator": GENERATOR_NAME,
        "generator_version": GENERATOR_VERSION,
        "synthetic": True,
        "seed": seed,
        "n_studies": len(records),
        "config_hash": config.config_hash(),
        "config": config.to_dict(),
        "files": counts,
        "lesions": stats["lesions"],
    }
    atomic_write_bytes(out / "cohort.json", (json.dumps(cohort, indent=2) + "\n").encode("utf-8"))
    atomic_write_bytes(out / "README.md", _readme(seed, len(records), config).encode("utf-8"))
    preview = render_preview(out, records[:PREVIEW_STUDIES])
    buf2 = io.BytesIO()
    preview.save(buf2, format="PNG", optimize=False)
    atomic_write_bytes(out / "preview.png", buf2.getvalue())
    return counts


def _readme(seed: int, n: int, config: SynthConfig) -> str:
    cmd = f"cxrground synth --out DIR --studies {n} --seed {seed} --width {config.width} --format {config.format}"
    quality = f", JPEG quality {config.jpeg_quality}" if config.format == "jpg" else ""
    return f"""# Synthetic chest X-ray cohort (TEST DATA)

This folder is **synthetic test data generated by cxrground** ({GENERATOR_NAME} {GENERATOR_VERSION}),
seed {seed}, {n} studies. The images are procedural phantoms and the reports are generated text: no real
patient, not for clinical use. Every truth record carries `"synthetic": true`.

Regenerate with `{cmd}` (other settings: see Configuration below).
The same seed and configuration give byte-identical files; study `i` depends only on (seed, i).

## Layout (mirrors MIMIC-CXR-JPG and the MIMIC-CXR reports)
| path | content |
|---|---|
| `index.csv` | subject_id, study_id, dicom_id, view, image_path, report_path, height, width (relative paths) |
| `mimic-cxr-2.0.0-metadata.csv.gz` | each image's view as MIMIC-CXR-JPG ships it (dicom_id, ViewPosition, ...) |
| `files/p1X/p1XXXXXXX/s5XXXXXXX/<dicom_id>.{config.format}` | frontal image, 8-bit grey{quality} |
| `files/p1X/p1XXXXXXX/s5XXXXXXX.txt` | free-text report (MIMIC-CXR layout) next to its study folder |
| `truth/s5XXXXXXX.json` | ground truth; written last, so a study is complete iff this file exists |
| `masks/s5XXXXXXX/{{right_lung,left_lung,heart}}.png` | anatomy masks, 0/255, native image size |
| `masks/s5XXXXXXX/lesion_{{k}}_{{lesion}}.png` | mask of the k-th present finding (k counts over the study's lesions) |
| `cohort.json` | generator, version, seed, configuration, file and lesion counts |
| `preview.png` | the first studies with lesion masks overlaid |

## Conventions
- Patient right is on the image LEFT (right lung at small x). Masks are at the image's native size.
- CTR = heart width / width of both lungs together (inclusive pixel extents of the masks).
  Normal hearts have CTR <= 0.45, borderline ones 0.45-0.5, cardiomegaly > 0.52.
- Truth per finding: lesion, present, reported, certainty (definitive/tentative; hedged sentence =
  tentative; null when unreported), sentence and section, location phrase, `reported_location` (the
  phrase mapped with the ILS.md §7.2 proposed lexicon), `overlap_location` (ILS labels whose
  `ils_location_masks` region the mask overlaps), mask path, COCO RLE and area. Negated lesions have
  present=false, reported=true and the negating sentence.
- A small fraction of present lesions is deliberately left out of the report (`reported: false`), so
  that report-driven pipelines can measure recall honestly.
- Report sentences may be wrapped across lines in the files; compare after collapsing whitespace.

## Configuration
```json
{json.dumps(config.to_dict(), indent=2)}
```
"""


# --- preview --------------------------------------------------------------------------------------

def render_preview(out: Path, records: list[StudyTruth]) -> Image.Image:
    """Contact sheet: each study with its lesion masks filled and outlined in the lesion colour."""
    cols = 4
    tile_w = PREVIEW_TILE
    tallest = max((t.height / t.width for t in records), default=1.0)
    tile_h = round(PREVIEW_TILE * tallest) + 30
    rows = max(1, (len(records) + cols - 1) // cols)
    sheet = Image.new("RGB", (cols * tile_w, rows * tile_h), (0, 0, 0))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for n, t in enumerate(records):
        gx, gy = (n % cols) * tile_w, (n // cols) * tile_h
        path = out / t.image_path
        if not path.exists():
            continue
        with Image.open(path) as im:
            grey = np.asarray(im.convert("L"), dtype=np.float32)
        rgb = np.repeat(grey[:, :, None], 3, axis=2)
        for f in t.present_findings:
            if f.mask is None:
                continue
            mask = decode_rle(f.mask.rle)
            color = np.array(LESION_COLORS[f.lesion], dtype=np.float32)
            rgb[mask] = 0.7 * rgb[mask] + 0.3 * color
            edge = mask & ~ndimage.binary_erosion(mask, iterations=max(1, t.width // 256))
            rgb[edge] = color
        scale = tile_w / t.width
        size = (tile_w, max(1, round(t.height * scale)))
        tile = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).resize(size, Image.Resampling.BILINEAR)
        sheet.paste(tile.crop((0, 0, tile_w, min(size[1], tile_h - 30))), (gx, gy))
        label = f"{t.study_id}  {t.view}  CTR {t.ctr:.2f}"
        draw.text((gx + 3, gy + tile_h - 27), label, fill=(255, 255, 255), font=font)
        x = gx + 3
        for f in t.present_findings:
            tag = ABBREVIATIONS[f.lesion]
            tag += ("?" if f.certainty == "tentative" else "") + ("" if f.reported else "-")
            draw.text((x, gy + tile_h - 14), tag, fill=LESION_COLORS[f.lesion], font=font)
            x += 7 * len(tag) + 8
        if not t.present_findings:
            draw.text((x, gy + tile_h - 14), "normal", fill=(200, 200, 200), font=font)
    return sheet


# --- summaries ------------------------------------------------------------------------------------

def summarize_records(records: Iterable[StudyTruth]) -> dict[str, Any]:
    """Counts per lesion and cohort statistics from truth records."""
    records = list(records)
    lesions: dict[str, dict[str, int]] = {}
    for lesion in LESIONS:
        present = [f for t in records for f in t.findings if f.lesion == lesion and f.present]
        lesions[lesion] = {
            "studies": sum(1 for t in records if lesion in t.lesions_present),
            "present": len(present),
            "definitive": sum(1 for f in present if f.certainty == "definitive"),
            "tentative": sum(1 for f in present if f.certainty == "tentative"),
            "unreported": sum(1 for f in present if not f.reported),
            "negated": sum(1 for t in records for f in t.findings if f.lesion == lesion and f.negated),
        }
    heights = [t.height for t in records]
    widths = [t.width for t in records]
    ctr = [t.ctr for t in records]
    by_status: dict[str, list[float]] = {}
    for t in records:
        by_status.setdefault(t.heart_status, []).append(t.ctr)
    return {
        "n_studies": len(records),
        "n_subjects": len({t.subject_id for t in records}),
        "normal_studies": sum(1 for t in records if t.normal),
        "impression_only": sum(1 for t in records if not t.has_findings_section),
        "views": dict(sorted(Counter(t.view for t in records).items())),
        "heights": [min(heights), max(heights)] if heights else [],
        "widths": [min(widths), max(widths)] if widths else [],
        "non_square": sum(1 for t in records if t.height != t.width),
        "ctr": [min(ctr), max(ctr)] if ctr else [],
        "ctr_by_heart_status": {k: [min(v), max(v), len(v)] for k, v in sorted(by_status.items())},
        "lesions": lesions,
    }


def summarize(out_dir: str | Path) -> dict[str, Any]:
    """Counts per lesion (present / definitive / tentative / unreported / negated), sizes and CTR range."""
    out = Path(out_dir)
    summary = summarize_records(load_truth(out))
    cohort = out / "cohort.json"
    if cohort.exists():
        try:
            meta = json.loads(cohort.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"cohort description is not JSON ({exc})", cohort) from exc
        if not isinstance(meta, dict):
            raise InputError("cohort description is not a JSON object", cohort)
        summary["seed"] = meta.get("seed")
        summary["generator_version"] = meta.get("generator_version")
    return summary


def summary_text(out_dir: str | Path, as_json: bool = False) -> str:
    """:func:`summarize` of the cohort in ``out_dir`` as JSON, or as :func:`format_summary`'s titled table."""
    summary = summarize(out_dir)
    return json.dumps(summary, indent=2) if as_json else format_summary(summary, out_dir)


def cohort_of_images(images: str | Path) -> Path | None:
    """The synthetic cohort an image folder (``COHORT/files``) belongs to, or None for any other folder."""
    root = Path(images).parent
    return root if (root / "truth").is_dir() and (root / "cohort.json").is_file() else None


def format_summary(summary: dict[str, Any], cohort_dir: str | Path | None = None) -> str:
    """A plain-text table of :func:`summarize` output; with ``cohort_dir``, a title line (folder, seed) first."""
    head = f"{'lesion':<14}{'studies':>8}{'present':>8}{'defin.':>8}{'tent.':>8}{'unrep.':>8}{'negated':>8}"
    lines = [head, "-" * len(head)]
    legend = ["studies: studies with the lesion; present: its findings (a study may have two, in two places), of",
              "which defin(itive), tent(ative: hedged in the report), unrep(orted: left out of the report on purpose);",
              "negated: findings of the lesion the report negates"]
    if cohort_dir is not None:
        title = f"{cohort_dir}: synthetic cohort"
        if summary.get("seed") is not None:
            title += f", seed {summary['seed']}, generator {summary.get('generator_version')}"
        lines.insert(0, title)
    for lesion, c in summary["lesions"].items():
        lines.append(f"{lesion:<14}{c['studies']:>8}{c['present']:>8}{c['definitive']:>8}{c['tentative']:>8}"
                     f"{c['unreported']:>8}{c['negated']:>8}")
    lines += legend
    lines.append("")
    lines.append(f"studies {summary['n_studies']} (subjects {summary['n_subjects']}, normal "
                 f"{summary['normal_studies']}, impression-only reports {summary['impression_only']})")
    if summary["heights"]:
        lines.append(f"image height {_span(summary['heights'])}, width {_span(summary['widths'])}, non-square "
                     f"{summary['non_square']}")
        lines.append(f"views {summary['views']}")
        lines.append(f"CTR {summary['ctr'][0]:.3f}..{summary['ctr'][1]:.3f}; by heart status: " + ", ".join(
            f"{k} {v[0]:.3f}..{v[1]:.3f} (n={v[2]})" for k, v in summary["ctr_by_heart_status"].items()))
    return "\n".join(lines)


def _span(values: list[int]) -> str:
    """``448..576``, or the one value when both ends are equal."""
    return str(values[0]) if values[0] == values[1] else f"{values[0]}..{values[1]}"
