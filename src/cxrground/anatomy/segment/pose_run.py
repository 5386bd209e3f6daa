"""``cxrground anatomy pose``: the pose reader over a folder of films, a list of those that look stored in a wrong
pose, and contact sheets to look at them. Nothing is rejected or changed: the list is for a person to check.

Outputs in ``OUT``: ``poses.csv`` (every film read, in film order), ``failures.jsonl`` (films that could not be
read), ``flagged/sheet-NNN.png`` (each flagged film as stored and as the reader would put it right, 20 per
sheet), ``poses.json`` (the weights, counts). Resumable: each film's reading is appended to
``.poses-progress.jsonl`` with the file's sha256 as it is done; a rerun of the same run (``.poses-run.json``: the
films and the weights) skips them, except a failed film whose file changed since (read again; all failed films with
``retry_failed``); a folder holding another run's results is refused unless ``overwrite``.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.plausibility import blank_problem
from cxrground.anatomy.segment.pose_net import (
    POSE_CLASSES,
    PoseReader,
    PoseReading,
    correction_name,
    read_pose_sidecar,
    undo_pose,
)
from cxrground.errors import BatchStopped, CXRGroundError, Failure, InputError
from cxrground.io.files import atomic_write_text, read_progress, sha256_file, sha256_json
from cxrground.io.film_ledger import resume_record
from cxrground.io.image import DEFAULT_MAX_PIXELS, check_out_folder, read_image
from cxrground.io.output_lock import locks_output
from cxrground.io.progress import progress_bar
from cxrground.io.run_folder import check_run_folder

__all__ = ["CSV_COLUMNS", "MAX_ASPECT", "MIN_SIDE", "SHEET_SIZE", "PoseRow", "contact_sheets", "film_problem",
           "write_poses"]

PROGRESS_FILE: Final[str] = ".poses-progress.jsonl"
RUN_FILE: Final[str] = ".poses-run.json"
SHEET_DIR: Final[str] = "flagged"
#: Films per contact sheet.
SHEET_SIZE: Final[int] = 20
_OUTPUTS: Final[tuple[str, ...]] = ("poses.csv", "failures.jsonl", "poses.json", PROGRESS_FILE, RUN_FILE)
CSV_COLUMNS: Final[tuple[str, ...]] = ("image", "flagged", "correction", "p_upright", "p_read")


@dataclass(frozen=True)
class PoseRow:
    """One film's reading: its name, the pose read, the probability of upright and of the pose read."""

    image: str
    pose: tuple[int, bool]
    p_upright: float
    p_read: float

    @property
    def flagged(self) -> bool:
        """The film looks stored in a wrong pose."""
        return self.pose != POSE_CLASSES[0]

    @property
    def correction(self) -> str:
        """What would put the film right, in words."""
        return correction_name(self.pose)


def _run_record(names: Sequence[str], reader: PoseReader, views: Mapping[str, str]) -> dict[str, Any]:
    return {"films": len(names), "films_sha256": sha256_json(list(names)), "weights_sha256": sha256_file(reader.path),
            "views_sha256": sha256_json(dict(sorted(views.items())))}


#: Files other commands write that an anatomy pose run would mix with (an ``anatomy zones`` or ``segment lungs
#: --images`` run's).
_FOREIGN: Final[tuple[str, ...]] = ("zones.csv", "zones.json", ".zones-run.json", "segment.csv", "segment.json",
                                    ".segment-run.json")


def _check_run(out: Path, record: dict[str, Any], overwrite: bool) -> None:
    """Refuse a folder holding another run's results; with ``overwrite`` delete whatever pose results it holds. A
    folder holding another command's results is refused either way (its ``failures.jsonl`` is not ours)."""
    check_run_folder(out, record, command="anatomy pose", run_file=RUN_FILE,
                     results=("poses.csv", "failures.jsonl", "poses.json", SHEET_DIR), foreign=_FOREIGN,
                     out_option="--out", overwrite=overwrite, clear=lambda: _clear(out))


def _clear(out: Path) -> None:
    """Delete what ``anatomy pose`` writes in ``out``, nothing else."""
    for name in _OUTPUTS:
        (out / name).unlink(missing_ok=True)
    if (out / SHEET_DIR).is_dir():
        shutil.rmtree(out / SHEET_DIR)


def _unreadable(path: Path, exc: OSError) -> InputError:
    return InputError(f"file cannot be read ({exc.strerror or exc})", path)


#: Films smaller than this on a side, or longer than :data:`MAX_ASPECT` times their width (or height), are not read.
MIN_SIDE: Final[int] = 64
MAX_ASPECT: Final[float] = 3.0


def film_problem(pixels: np.ndarray) -> str | None:
    """Why ``pixels`` cannot be a frontal chest film whose pose can be read (too small, too elongated, blank), or
    None."""
    h, w = pixels.shape[:2]
    if min(h, w) < MIN_SIDE:
        return f"image is {w}x{h} px: too small to read a chest's pose ({MIN_SIDE} px a side at least)"
    if max(h, w) > MAX_ASPECT * min(h, w):
        return f"image is {w}x{h} px: too elongated for a frontal chest film (sides within {MAX_ASPECT:g}:1)"
    return blank_problem(pixels)


def _row(name: str, probabilities: Sequence[float]) -> PoseRow:
    reading = PoseReading(tuple(float(p) for p in probabilities))
    return PoseRow(name, reading.pose, round(reading.probabilities[0], 4), round(reading.confidence, 4))


def _csv_text(rows: Sequence[PoseRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow([r.image, int(r.flagged), r.correction, f"{r.p_upright:.4f}", f"{r.p_read:.4f}"])
    return buf.getvalue()


def contact_sheets(films: Sequence[tuple[str, np.ndarray | Path, PoseRow]], out_dir: Path, side: int = 224
                   ) -> list[Path]:
    """PNG sheets of flagged films, each as stored beside the same film put right as the reader proposes; a film
    given by its path is read when its sheet is drawn (one sheet's films in memory at a time), and one that can no
    longer be read is left out."""
    from PIL import Image, ImageDraw

    paths = []
    cols, cap = 4, 44
    for start in range(0, len(films), SHEET_SIZE):
        chunk = films[start:start + SHEET_SIZE]
        rows = (len(chunk) + cols - 1) // cols
        sheet = Image.new("L", (cols * 2 * side, rows * (side + cap)), 255)
        draw = ImageDraw.Draw(sheet)
        drawn = 0
        for name, source, row in chunk:
            try:
                pixels = read_image(source).pixels if isinstance(source, Path) else source
            except CXRGroundError:
                continue
            i, drawn = drawn, drawn + 1
            fixed = undo_pose(pixels, row.pose)
            x, y = (i % cols) * 2 * side, (i // cols) * (side + cap)
            for j, px in enumerate((pixels, fixed)):
                im = Image.fromarray(px)
                im.thumbnail((side - 4, side - 4))
                sheet.paste(im, (x + j * side + (side - im.width) // 2, y + (side - im.height) // 2))
            draw.text((x + 4, y + side + 2), name if len(name) <= 72 else "…" + name[-71:], fill=0)
            draw.text((x + 4, y + side + 15), "left: as stored", fill=0)
            draw.text((x + 4, y + side + 28), f"right: {row.correction} (P {row.p_read:.2f})", fill=0)
        path = out_dir / f"sheet-{start // SHEET_SIZE + 1:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        sheet.save(path)
        paths.append(path)
    return paths


@locks_output("anatomy pose", "out")
def write_poses(paths: Sequence[Path], out: Path, reader: PoseReader, root: Path | None = None,
                overwrite: bool = False, sheets: bool = True, progress: bool = True,
                views: Mapping[str, str] | None = None, frontal: Callable[[str], bool] | None = None,
                max_pixels: int | None = DEFAULT_MAX_PIXELS, retry_failed: bool = False
                ) -> tuple[list[PoseRow], list[Failure]]:
    """Read the pose of every film; write ``out/poses.csv``, ``failures.jsonl``, ``poses.json`` and (with
    ``sheets``) the contact sheets of the flagged films; return the rows and failures (see the module).

    A film whose view (its DICOM header, else ``views`` by file-name stem) is one ``frontal`` refuses is a failure,
    not read: the reader knows frontal chests only, and a lateral film would be listed as wrongly posed.

    On a resumed run a film recorded as a failure is read again when its file changed since, and every such film
    with ``retry_failed``; a film read before whose file changed is refused (``overwrite`` starts afresh)."""
    if root is not None:
        check_out_folder(out, root)
    reader.load()  # weights that cannot be read stop the run before any film is recorded
    names = [p.relative_to(root).as_posix() if root is not None else p.name for p in paths]
    views = {p.stem: views[p.stem] for p in paths if views and p.stem in views}
    record = _run_record(names, reader, views)
    out.mkdir(parents=True, exist_ok=True)
    _check_run(out, record, overwrite)
    atomic_write_text(out / RUN_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    done = read_progress(out / PROGRESS_FILE)
    rows: list[PoseRow] = []
    failures: list[Failure] = []
    with (out / PROGRESS_FILE).open("a", encoding="utf-8") as log:
        for path, name in progress_bar(list(zip(paths, names, strict=True)), desc="pose", progress=progress):
            rec = done.get(name)
            try:
                digest, stat, rec = resume_record(path, name, rec, log, out=out, kept="probabilities",
                                                  retry_failed=retry_failed, verb="read")
            except OSError as exc:  # a broken link, a file gone since the folder was listed: looked at on every run
                failures.append(Failure.from_exception(path, "pose", _unreadable(path, exc)))
                continue
            if rec is None:
                try:
                    image = read_image(path, max_pixels=max_pixels)
                    view = image.view or views.get(path.stem)
                    if view and frontal is not None and not frontal(view):
                        raise InputError(f"view {view.upper()} is not frontal (PA/AP): poses are read on frontal "
                                         "films", path)
                    problem = film_problem(image.pixels)
                    if problem:
                        raise InputError(problem, path)
                    probabilities = reader.read(image.pixels).probabilities
                except BatchStopped:  # a library of an extra missing: every film would fail alike
                    raise
                except (InputError, CXRGroundError) as exc:
                    rec = {"image": name, "sha256": digest, **stat,
                           "failure": Failure.from_exception(path, "pose", exc).to_dict()}
                else:
                    rec = {"image": name, "sha256": digest, **stat, "probabilities": list(probabilities)}
                log.write(json.dumps(rec, sort_keys=True) + "\n")
                log.flush()
            if "failure" in rec:
                failures.append(Failure(**rec["failure"]))
            else:
                rows.append(_row(name, rec["probabilities"]))
    atomic_write_text(out / "poses.csv", _csv_text(rows))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f.to_dict()) + "\n" for f in failures))
    flagged = [r for r in rows if r.flagged]
    written: list[Path] = []
    if (out / SHEET_DIR).is_dir():
        shutil.rmtree(out / SHEET_DIR)
    if sheets and flagged:
        by_name = dict(zip(names, paths, strict=True))
        written = contact_sheets([(r.image, by_name[r.image], r) for r in flagged], out / SHEET_DIR)
    summary = {"weights": str(reader.path), "weights_name": read_pose_sidecar(reader.path).get("name"),
               "weights_sha256": record["weights_sha256"], "films": len(rows),
               "flagged": len(flagged), "failures": len(failures),
               "sheets": [p.relative_to(out).as_posix() for p in written],
               "validation": "bench/records/pose_net_preregistration.md"}
    atomic_write_text(out / "poses.json", json.dumps(summary, indent=1) + "\n")
    return rows, failures
