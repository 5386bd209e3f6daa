"""``cxrground segment lungs --images DIR``: the lungs and heart of every film under a folder, one output folder per
film, a summary table and a failures record.

Each film is segmented as ``segment lungs --image`` segments one (:func:`~cxrground.anatomy.segment.output.
segment_film`): ``OUT/<path under DIR>/`` (the film's relative path, its file name included: ``sub/x.png`` →
``OUT/sub/x.png/``, so that films of the same name in two folders, or ``x.png`` beside ``x.jpg``, never share a
folder) holds its ``right_lung.png``, ``left_lung.png``, ``heart.png``, ``overlay.png`` and ``masks.json``.

Also in ``OUT``: ``segment.csv`` (:data:`CSV_COLUMNS`, one row per film in film order, failed films included),
``failures.jsonl`` (the films that could not be segmented, with the reason), ``segment.json`` (the segmenter's
provenance and the counts). Resumable: each film's row (or failure) is appended to ``.segment-progress.jsonl`` with
the film's sha256, size and modification time as it is done; ``.segment-run.json`` records the run (the films, the
backend, its options and settings, the orientation check). A rerun with the same record skips the films done (a film
whose ``masks.json`` is gone is segmented again; a film segmented before whose file changed is refused; a failed film
is read again when its file changed, every failed film with ``retry_failed``); a folder holding another run's results
is refused unless ``overwrite``, which deletes what this module writes there first.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Literal

from cxrground.anatomy.segment.base import LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.builtin import ctr_plausible
from cxrground.anatomy.segment.output import SegmentationOutput, segment_film
from cxrground.anatomy.segment.registry import segmenter_settings
from cxrground.errors import BatchStopped, CXRGroundError, Failure, InputError
from cxrground.io.files import atomic_write_text, read_progress, sha256_json
from cxrground.io.film_ledger import resume_record
from cxrground.io.image import DEFAULT_MAX_PIXELS, check_out_folder
from cxrground.io.output_lock import locks_output
from cxrground.io.progress import progress_bar
from cxrground.io.run_folder import check_run_folder
from cxrground.registry import read_provenance

__all__ = ["CSV_COLUMNS", "FILM_FILES", "OUTPUTS", "PROGRESS_FILE", "RUN_FILE", "SegmentBatch", "SegmentRow",
           "film_folder", "segment_folder"]

PROGRESS_FILE: Final[str] = ".segment-progress.jsonl"
RUN_FILE: Final[str] = ".segment-run.json"
#: The files a run writes at the top of its output folder (``overwrite`` deletes these and the films' files).
OUTPUTS: Final[tuple[str, ...]] = ("segment.csv", "failures.jsonl", "segment.json", RUN_FILE, PROGRESS_FILE)
#: The files written into each film's folder (those of ``segment lungs --image``).
FILM_FILES: Final[tuple[str, ...]] = ("right_lung.png", "left_lung.png", "heart.png", "overlay.png", "masks.json")
#: ``segment.csv``: the film (its path under the image folder), ``ok`` / ``check`` / ``failed``, its output folder
#: (under the output folder; blank when it failed), the CTR, where the heart comes from, whether the CTR is plausible
#: (1/0, blank without a heart), whether the lungs are plausible (1/0) and why not, whether the film was read as
#: ``stored`` or as its grey-level ``negative``, the orientation check's warning (with ``--qc-orientation``) and the
#: reason a film failed.
CSV_COLUMNS: Final[tuple[str, ...]] = ("image", "status", "folder", "ctr", "heart_source", "ctr_plausible",
                                       "lungs_plausible", "lung_problems", "read_as", "orientation", "error")
#: Files of the other folder commands: an output folder holding them is refused (their ``failures.jsonl`` is theirs).
_FOREIGN: Final[tuple[str, ...]] = ("zones.csv", "zones.json", ".zones-run.json", "poses.csv", "poses.json",
                                    ".poses-run.json")
#: The layout of the progress records: a run recorded with another is refused on resume.
_PROGRESS_LAYOUT: Final[int] = 1

Status = Literal["ok", "check", "failed"]


@dataclass(frozen=True)
class SegmentRow:
    """One film's row of ``segment.csv`` (:data:`CSV_COLUMNS`). ``status``: ``ok`` (masks written, nothing flagged),
    ``check`` (masks written with a warning: implausible lungs, an implausible CTR, an estimated heart whose floor is
    uncertain (``heart_estimate.floor_warning`` in ``masks.json``) or, with the orientation check, a
    film that looks stored in a wrong pose: look at its ``overlay.png`` before using them) or ``failed`` (nothing
    written, ``error`` says why)."""

    image: str
    status: Status
    folder: str = ""
    ctr: float | None = None
    heart_source: str = ""
    ctr_plausible: bool | None = None
    lungs_plausible: bool | None = None
    lung_problems: tuple[str, ...] = ()
    read_as: str = ""
    orientation: str = ""
    error: str = ""

    @classmethod
    def written(cls, image: str, folder: str, output: SegmentationOutput, masks: LungHeartMasks) -> SegmentRow:
        """The row of a film whose files were written."""
        record = output.record
        problems = tuple(record.get("lung_problems") or ())
        plausible = ctr_plausible(masks, output.ctr)
        orientation = str(record.get("orientation") or "")
        estimate = masks.extra.get("heart_estimate") or {}
        floor = masks.heart_source == "estimate" and bool(estimate.get("floor_warning"))
        flagged = bool(problems) or plausible is False or bool(orientation) or floor
        return cls(image, "check" if flagged else "ok", folder, output.ctr, masks.heart_source, plausible,
                   not problems, problems, "negative" if masks.extra.get("polarity") else "stored", orientation)

    @classmethod
    def failed(cls, image: str, failure: Failure) -> SegmentRow:
        """The row of a film that could not be segmented."""
        return cls(image, "failed", error=failure.reason)

    def to_json(self) -> dict[str, Any]:
        """The row as its progress record holds it."""
        return {**asdict(self), "lung_problems": list(self.lung_problems)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SegmentRow:
        """The row of a progress record (:meth:`to_json`)."""
        return cls(**{**value, "lung_problems": tuple(value.get("lung_problems") or ())})

    def csv_row(self) -> dict[str, str]:
        """The row of ``segment.csv``."""

        def flag(value: bool | None) -> str:
            return "" if value is None else str(int(value))

        return {"image": self.image, "status": self.status, "folder": self.folder,
                "ctr": "" if self.ctr is None else f"{self.ctr:.4f}", "heart_source": self.heart_source,
                "ctr_plausible": flag(self.ctr_plausible), "lungs_plausible": flag(self.lungs_plausible),
                "lung_problems": "; ".join(self.lung_problems), "read_as": self.read_as,
                "orientation": self.orientation, "error": self.error}


@dataclass(frozen=True)
class SegmentBatch:
    """What :func:`segment_folder` did: one row per film (film order) and the failures."""

    out: Path
    rows: list[SegmentRow]
    failures: list[Failure]

    @property
    def segmented(self) -> int:
        """Films whose masks were written."""
        return sum(r.status != "failed" for r in self.rows)

    def summary_lines(self) -> list[str]:
        """The console summary: counts, the films to check, where the failures are."""
        check = sum(r.status == "check" for r in self.rows)
        line = (f"wrote {self.out / 'segment.csv'}: {self.segmented} films segmented into {self.out}/<film>/, "
                f"{check} to check (status check: implausible lungs, CTR or heart floor"
                + (", or a wrong pose" if any(r.orientation for r in self.rows) else "") + f"), "
                f"{len(self.failures)} failures")
        if self.failures:
            line += f" (in {self.out / 'failures.jsonl'}; first: {self.failures[0].path}: {self.failures[0].reason})"
        return [line]


def film_folder(name: str) -> str:
    """The output folder of the film ``name`` (its path under the image folder), relative to the output folder: the
    same path, file name included (``sub/x.png`` → ``sub/x.png``), so two films never share one."""
    return name


def _run_record(names: Sequence[str], backend: str, options: Mapping[str, Any], settings: dict[str, Any],
                orientation_check: bool) -> dict[str, Any]:
    return {"films": len(names), "films_sha256": sha256_json(list(names)), "backend": backend,
            "options": json.loads(json.dumps(dict(options), default=str, sort_keys=True)), "segmenter": settings,
            "orientation_check": orientation_check, "progress_layout": _PROGRESS_LAYOUT}


def _clear(out: Path, names: Sequence[str]) -> None:
    """Delete what a run writes in ``out``: the files of the films recorded there and of ``names`` (the films of
    the new run), the folders left empty by that, and the top-level files; nothing else."""
    films = {*read_progress(out / PROGRESS_FILE), *names}
    for name in films:
        folder = out / film_folder(name)
        for file in FILM_FILES:
            (folder / file).unlink(missing_ok=True)
        for sub in (folder, *folder.relative_to(out).parents):
            path = out / sub
            if path == out or not path.is_dir() or any(path.iterdir()):
                break
            path.rmdir()
    for file in OUTPUTS:
        (out / file).unlink(missing_ok=True)


def _check_run(out: Path, record: dict[str, Any], names: Sequence[str], overwrite: bool) -> None:
    """Refuse a folder holding another run's results (other films, backend or settings) unless ``overwrite``,
    which deletes them (:func:`_clear`); the same run resumes. Another command's results are refused either way."""
    check_run_folder(out, record, command="segment lungs", run_file=RUN_FILE,
                     results=("segment.csv", "failures.jsonl", "segment.json"), foreign=_FOREIGN,
                     out_option="--out-dir", overwrite=overwrite, clear=lambda: _clear(out, names))


@locks_output("segment lungs", "out")
def segment_folder(paths: Sequence[Path], out: Path, segmenter: LungHeartSegmenter, root: Path,
                   backend: str, options: Mapping[str, Any] | None = None, orientation_check: bool = False,
                   max_pixels: int | None = DEFAULT_MAX_PIXELS, overwrite: bool = False, retry_failed: bool = False,
                   progress: bool = True) -> SegmentBatch:
    """Segment every film of ``paths`` (under ``root``) with ``segmenter`` into ``out`` (see the module); returns
    the rows and failures. ``backend`` and ``options``: the segmenter's name and the options it was made with (kept
    in the run record; a resume with others is refused). A film that cannot be read or segmented is recorded and
    the rest go on; a problem every film shares (:class:`~cxrground.errors.BatchStopped`) stops the run.
    ``max_pixels``: films whose header states more pixels are failures, not decoded. ``progress``: a progress bar."""
    check_out_folder(out, root)
    paths = list(paths)
    names = [p.relative_to(root).as_posix() for p in paths]
    settings = segmenter_settings(segmenter)  # loads the weights: unusable ones stop the run before any film
    provenance = read_provenance("segmenter", segmenter) or {"name": getattr(segmenter, "name", backend)}
    record = _run_record(names, backend, options or {}, settings, orientation_check)
    out.mkdir(parents=True, exist_ok=True)
    _check_run(out, record, names, overwrite)
    atomic_write_text(out / RUN_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    done = read_progress(out / PROGRESS_FILE)
    rows: list[SegmentRow] = []
    failures: list[Failure] = []
    bar = progress_bar(total=len(paths), desc="segment", unit="film", progress=progress)
    with (out / PROGRESS_FILE).open("a", encoding="utf-8") as log:
        for path, name in zip(paths, names, strict=True):
            bar.update(1)
            rec = done.get(name)
            folder = film_folder(name)
            try:
                digest, stat, rec = resume_record(path, name, rec, log, out=out, kept="row",
                                                  retry_failed=retry_failed, verb="segmented")
            except OSError as exc:  # a broken link, a file gone since the folder was listed: looked at on every run
                failures.append(Failure.from_exception(path, "segment", InputError(
                    f"file cannot be read ({exc.strerror or exc})", path)))
                rows.append(SegmentRow.failed(name, failures[-1]))
                continue
            if rec is not None and "row" in rec and (out / folder / "masks.json").is_file():
                rows.append(SegmentRow.from_json(rec["row"]))
                continue
            if rec is not None and "failure" in rec:  # a recorded failure of the same film, kept
                failures.append(Failure(**rec["failure"]))
                rows.append(SegmentRow.failed(name, failures[-1]))
                continue
            try:
                written, masks = segment_film(path, out / folder, segmenter, orientation_check, max_pixels, backend,
                                              provenance)
            except BatchStopped:  # a library of an extra missing: every film would fail alike
                raise
            except (InputError, CXRGroundError) as exc:
                failure = Failure.from_exception(path, "segment", exc)
                failures.append(failure)
                rows.append(SegmentRow.failed(name, failure))
                line = {"image": name, "sha256": digest, **stat, "failure": failure.to_dict()}
            else:
                rows.append(SegmentRow.written(name, folder, written, masks))
                line = {"image": name, "sha256": digest, **stat, "row": rows[-1].to_json()}
            log.write(json.dumps(line, sort_keys=True) + "\n")
            log.flush()
    bar.close()
    atomic_write_text(out / "segment.csv", _csv_text(rows))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f.to_dict()) + "\n" for f in failures))
    summary = {"backend": backend, "segmenter": provenance,
               "orientation_check": orientation_check, "films": len(rows),
               "ok": sum(r.status == "ok" for r in rows), "check": sum(r.status == "check" for r in rows),
               "failures": len(failures)}
    atomic_write_text(out / "segment.json", json.dumps(summary, indent=1, default=str) + "\n")
    return SegmentBatch(out, rows, failures)


def _csv_text(rows: Sequence[SegmentRow]) -> str:
    fh = io.StringIO(newline="")
    writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.csv_row())
    return fh.getvalue()
