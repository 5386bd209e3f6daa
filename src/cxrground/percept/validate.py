"""``cxrground percept validate``: every check a built benchmark must pass (CHEXPERCEPT.md §3, §10.3, §12, §19).

Checks: the JSON schema; every referenced image exists, is a PNG without text chunks and has the size
``image_size`` (equal to the CXR's, i.e. to ``stage1``); every answer index is within its options;
multi-select answers are sets without duplicates, in any order (the point answers list the GT points in GT
order, §4); option counts (2 for detection / contour evaluation,
≤ 9 points with ``None`` last, 3-4 mask options, 4 location options); path rules (LF: detection only);
no leakage (no path, folder or file name containing ``answer``, ``fake``, ``true``, ``positive``, ``negative``,
``correct``); counts in ``card.md`` match the JSON; ``MANIFEST.sha256`` lists every file with its hash (except
the review page ``gallery.html``); no image path leaves the benchmark folder (:mod:`cxrground.percept.paths`).
The revision QAs of an RF case are not asked: their images (the points overlay, the revision options) are
checked only where the folder holds them, since a reference export writes none (its JSON may still name them).
Returns a list of human-readable problems (empty = valid).

A benchmark without ``MANIFEST.sha256`` was not made by ``percept build`` (e.g. the reference repository's, or
one made by hand): it is checked without the build records (manifest, ``card.md``, ``image_size``), and a note
says so (:func:`records_note`). :func:`require_valid` is the check an export runs first (``percept export``):
the same checks, refusing the export with the problems listed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from PIL import Image

from cxrground.errors import InputError
from cxrground.percept.layout import BUILD_SETTINGS_FILE
from cxrground.percept.paths import unsafe_reason
from cxrground.percept.schema import BENCHMARK_FILE, Case, ground_truth_problems, load_benchmark
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import (
    NONE_OPTION,
    PATH_LESION_FREE,
    PATH_REVISION_FREE,
    PATH_REVISION_REQUIRED,
    POINT_COLORS,
)
from cxrground.vocab.traits import lesions_where

__all__ = ["LEAK_WORDS", "records_note", "require_valid", "unreviewed", "validate_benchmark"]

#: Words that must not appear in any path of the benchmark (§10.3).
LEAK_WORDS: Final[tuple[str, ...]] = ("answer", "fake", "true", "positive", "negative", "correct")
_TEXT_CHUNKS: Final[tuple[bytes, ...]] = (b"tEXt", b"zTXt", b"iTXt")
#: Lesions whose RF/RR cases have no Stage 4 (cardiomegaly).
_NO_STAGE4: Final[tuple[str, ...]] = lesions_where(lambda t: not t.percept.attributes)
_CARD_ROW = re.compile(r"^\| (\w+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|")
_PATHS = (PATH_LESION_FREE, PATH_REVISION_FREE, PATH_REVISION_REQUIRED)


def _png_chunks(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG file")
    chunks, pos = [], 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        chunks.append(data[pos + 4:pos + 8])
        pos += 12 + length
    return chunks


def _check_image(root: Path, rel: str | None, size: list[int] | None, where: str, problems: list[str],
                 asked: bool = True) -> None:
    """Check one image; an image that is not ``asked`` (an RF case's revision images) may be absent."""
    if rel is None:
        problems.append(f"{where}: no image path")
        return
    reason = unsafe_reason(root.resolve(), rel)
    if reason is not None:
        problems.append(f"{where}: image path {rel!r} {reason}")
        return
    path = root / rel
    if not path.is_file():
        if asked:
            problems.append(f"{where}: image {rel} does not exist")
        return
    try:
        chunks = _png_chunks(path)
        with Image.open(path) as im:
            got = [im.height, im.width]
            mode = im.mode
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # the last: a header claiming gigapixels
        problems.append(f"{where}: image {rel} cannot be read as PNG ({exc})")
        return
    if any(c in _TEXT_CHUNKS for c in chunks):
        problems.append(f"{where}: image {rel} carries PNG text chunks (metadata leak)")
    if mode != "RGB":
        problems.append(f"{where}: image {rel} is {mode}, expected RGB")
    if size is not None and got != list(size):
        problems.append(f"{where}: image {rel} is {got[0]}x{got[1]} (HxW), expected {size[0]}x{size[1]}")


def _single(qa: Any, n_options: int | None, where: str, problems: list[str]) -> None:
    if n_options is not None and len(qa.answer_options) != n_options:
        problems.append(f"{where}: {len(qa.answer_options)} options, expected {n_options}")
    if not 1 <= qa.answer_index <= len(qa.answer_options):
        problems.append(f"{where}: answer_index {qa.answer_index} outside 1..{len(qa.answer_options)}")


def _multi(indices: list[int], n_options: int, where: str, problems: list[str]) -> None:
    if not indices:
        problems.append(f"{where}: empty multi-select answer")
    if len(set(indices)) != len(indices):
        problems.append(f"{where}: duplicate indices in multi-select answer {indices}")
    bad = [i for i in indices if not 1 <= i <= n_options]
    if bad:
        problems.append(f"{where}: answer indices {bad} outside 1..{n_options}")


def _check_case(root: Path, key: str, case: Case, problems: list[str]) -> None:
    size = case.image_size
    det = case.detection_qa
    _single(det, 2, f"{key}.detection_qa", problems)
    _check_image(root, det.relative_path, size, f"{key}.detection_qa", problems)
    path = case.path(key)
    problems.extend(f"{key}: {problem}" for problem in ground_truth_problems(case, path))
    if path == PATH_LESION_FREE:
        if case.contour_qa is not None or case.attribute_extraction_qa is not None:
            problems.append(f"{key}: a lesion-free case must hold only detection_qa and ids")
        return
    cq = case.contour_qa
    if cq is None:
        problems.append(f"{key}: positive case without contour_qa")
        return
    ev = cq.contour_eval_qa
    _single(ev, 2, f"{key}.contour_eval_qa", problems)
    if ev.answer_index != (2 if cq.no_deformation else 1):
        problems.append(f"{key}.contour_eval_qa: answer_index {ev.answer_index} does not match the path")
    _check_image(root, ev.relative_path, size, f"{key}.contour_eval_qa", problems)
    asked = not cq.no_deformation  # §10.2: an RF case's revision QAs are not asked
    for op in ("expansion", "contraction"):
        qa = getattr(cq, f"contour_revision_qa_{op}")
        where = f"{key}.contour_revision_qa_{op}"
        if qa is None:
            problems.append(f"{where}: missing")
            continue
        opts = qa.answer_options
        if not 2 <= len(opts) <= len(POINT_COLORS) + 1:
            problems.append(f"{where}: {len(opts)} point options, expected 2..{len(POINT_COLORS) + 1}")
        if opts and (opts[-1].point is not None or opts[-1].color != NONE_OPTION):
            problems.append(f"{where}: the last option must be {{point: null, color: None}}")
        _multi(qa.answer_index, len(opts), where, problems)
        if qa.relative_path is not None:
            _check_image(root, qa.relative_path, size, where, problems, asked)
        elif op == "expansion" and not cq.no_deformation:
            problems.append(f"{where}: an RR expansion question must name its image")
    rev = cq.contour_revision_qa_revision_result
    if rev is None:
        problems.append(f"{key}.contour_revision_qa_revision_result: missing")
    else:
        where = f"{key}.contour_revision_qa_revision_result"
        if not 3 <= len(rev.answer_options) <= 4:
            problems.append(f"{where}: {len(rev.answer_options)} mask options, expected 3 or 4")
        _single(rev, None, where, problems)
        if 1 <= rev.answer_index <= len(rev.answer_options) and rev.answer_options[rev.answer_index - 1].type != "true":
            problems.append(f"{where}: the answer option is not the true combination")
        for k, opt in enumerate(rev.answer_options, start=1):
            if opt.relative_path is not None:
                _check_image(root, opt.relative_path, size, f"{where}.option{k}", problems, asked)
            elif not cq.no_deformation:
                problems.append(f"{where}.option{k}: an RR revision option must name its image")
    attrs = case.attribute_extraction_qa
    lesion = case.lesion_of(key)
    if lesion in _NO_STAGE4:
        if attrs is not None:
            problems.append(f"{key}: {lesion} has no attribute_extraction_qa")
        return
    if attrs is None:
        problems.append(f"{key}: lung-lesion positive case without attribute_extraction_qa")
        return
    _single(attrs.distribution, 4, f"{key}.distribution", problems)
    if len(attrs.location.answer_options) != 4:
        problems.append(f"{key}.location: {len(attrs.location.answer_options)} options, expected 4")
    _multi(attrs.location.answer_index, len(attrs.location.answer_options), f"{key}.location", problems)
    _single(attrs.severity, 3, f"{key}.severity", problems)
    _single(attrs.comparison, 4, f"{key}.comparison", problems)


def _leaks(paths: Iterable[str]) -> list[str]:
    out = []
    for rel in paths:
        low = rel.lower()
        hits = [w for w in LEAK_WORDS if w in low]
        if hits:
            out.append(f"leaking name: {rel} contains {', '.join(hits)}")
    return out


def _card_counts(text: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        m = _CARD_ROW.match(line)
        if m and m.group(1) in LESIONS:
            vals = [int(g.replace(",", "")) for g in m.groups()[1:]]
            out[m.group(1)] = {p: vals[2 * i + 1] for i, p in enumerate(_PATHS)}
    return out


def _check_manifest(root: Path, problems: list[str]) -> None:
    from cxrground.percept.layout import MANIFEST_FILE
    from cxrground.percept.manifest import manifest_lines, read_manifest

    if not (root / MANIFEST_FILE).is_file():
        problems.append(f"{MANIFEST_FILE} missing")
        return
    listed = read_manifest(root)  # without the gallery page an older manifest may list
    actual = dict(reversed(line.split("  ", 1)) for line in manifest_lines(root))
    for rel in sorted(set(listed) | set(actual)):
        if rel not in actual:
            problems.append(f"manifest lists {rel}, which does not exist")
        elif rel not in listed:
            problems.append(f"manifest does not list {rel}")
        elif listed[rel] != actual[rel]:
            problems.append(f"manifest hash mismatch for {rel}")


def records_note(bench: str | Path) -> str | None:
    """The note saying that the benchmark folder ``bench`` is checked without its build records (None when it holds
    ``MANIFEST.sha256``, i.e. was made by ``percept build``)."""
    from cxrground.percept.layout import MANIFEST_FILE, WORK_DIR

    root = Path(bench)
    if (root / MANIFEST_FILE).is_file():
        return None
    if (root / WORK_DIR).is_dir():
        return (f"{root}: an unfinished percept build (it holds {WORK_DIR}/ and no {MANIFEST_FILE}: the build was cut "
                "short or is running): rerun the same percept build to finish it")
    return (f"{root}: no {MANIFEST_FILE} (not made by percept build): checked without the build records (file "
            "hashes, card.md, image sizes)")


def validate_benchmark(bench: str | Path, *, records: bool | None = None,
                       note: Callable[[str], None] | None = None) -> list[str]:
    """Every problem found in the benchmark folder ``bench`` (empty list = valid). ``records``: whether the build
    records (``MANIFEST.sha256``, ``card.md`` and each case's ``image_size``) are checked; by default when the
    folder holds ``MANIFEST.sha256``, and otherwise ``note`` receives :func:`records_note`."""
    from cxrground.percept.layout import CARD_FILE

    root = Path(bench)
    if records is None:
        missing = records_note(root)
        records = missing is None
        if missing is not None and note is not None:
            note(missing)
    problems: list[str] = []
    try:
        benchmark = load_benchmark(root)
    except InputError as exc:
        return [str(exc)]
    all_paths = [p.relative_to(root).as_posix() for p in root.rglob("*") if not p.name.startswith(".")
                 and not p.relative_to(root).as_posix().startswith(".work")]
    problems += _leaks(all_paths)
    if not benchmark.cases:
        problems.append(f"{BENCHMARK_FILE} has no cases (the build's card and failures.jsonl say why)")
    counts: dict[str, dict[str, int]] = {lesion: dict.fromkeys(_PATHS, 0) for lesion in LESIONS}
    for key, case in benchmark.cases.items():
        refs = [case.detection_qa.relative_path or ""]
        if case.image_size is None and records:
            problems.append(f"{key}: no image_size")
        _check_case(root, key, case, problems)
        if case.contour_qa is not None:
            refs.append(case.contour_qa.contour_eval_qa.relative_path)
        problems += [f"{key}: {p}" for p in _leaks(r for r in refs if r)]
        lesion = case.lesion_of(key)
        if lesion in counts:
            counts[lesion][case.path(key)] += 1
        else:
            problems.append(f"{key}: unknown lesion {lesion!r}")
    card = root / CARD_FILE
    if not records:
        return problems
    if not card.is_file():
        problems.append(f"{CARD_FILE} missing")
    else:
        stated = _card_counts(card.read_text(encoding="utf-8"))
        for lesion in LESIONS:
            for path in _PATHS:
                want = stated.get(lesion, {}).get(path)
                if want != counts[lesion][path]:
                    problems.append(f"count mismatch: card says {want} {lesion} {path} cases, "
                                    f"{BENCHMARK_FILE} has {counts[lesion][path]}")
    _check_manifest(root, problems)
    return problems


def unreviewed(bench: str | Path) -> bool:
    """True when ``bench`` records that it was built without an expert review (its ``build_settings.json`` names no
    review file); False when it names one or records nothing (e.g. the reference layout)."""
    try:
        settings = json.loads((Path(bench) / BUILD_SETTINGS_FILE).read_text(encoding="utf-8"))["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(settings, dict) and "review" in settings and not settings["review"]


def require_valid(bench: str | Path, action: str = "export") -> list[str]:
    """Check the benchmark ``bench`` (its folder or its JSON file) before ``action``: raise :class:`InputError`
    naming the folder and listing every problem when :func:`validate_benchmark` finds any; returns the notes for
    the user (a benchmark without ``MANIFEST.sha256`` is checked without its build records, module docstring)."""
    path = Path(bench)
    root = path if path.is_dir() else path.parent
    notes: list[str] = []
    problems = validate_benchmark(root, note=notes.append)
    if problems:
        listed = "".join(f"\n  {p}" for p in problems)
        raise InputError(f"{len(problems)} problem(s) found by percept validate; {action} refused (fix the "
                         f"benchmark or rebuild it; --no-validate skips this check):{listed}", root)
    return notes
