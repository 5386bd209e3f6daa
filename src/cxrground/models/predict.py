"""Predictions of an ILS model for a whole split, as the predictions JSONL read by ``ils evaluate``.

Resumable: pairs already in the output file are skipped, when they were made by the same checkpoint for the same
dataset and split. ``<out>.checkpoint.json`` keeps what the file was made from: the checkpoint's fingerprint, the
dataset JSON's sha256 and the split (pair ids repeat between datasets, so predictions for another dataset or split
are never mixed in; a file whose record lacks the dataset is refused too, since what it was made for is unknown).
``--limit``, ``--batch-size``, ``--images`` and ``--max-pixels`` may change between runs: they do not change the
prediction of a pair (a larger limit predicts more of the same split; the image root only says where the same
files are). ``<out>.films.jsonl`` (:class:`~cxrground.io.film_ledger.FilmLedger`) records each film's size,
modification time and sha256 when its pairs are predicted; a rerun compares the films of the kept predictions with it
(a ``stat`` each; another size is another film, and the content is read when only the time differs, as after a copy
to another root) and predicts again the pairs of a film that changed since, saying how many. An image that cannot be
read (decode error, over the pixel limit, too small for the model) is recorded in ``<out>.failures.jsonl`` and its pairs
get no line (they count as missing, i.e. wrong, in ``ils evaluate``). A
rerun retries those images and drops every record that names a pair it retries or that now has a prediction, so
the failures file holds one line per image that still fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import BackendError, ConfigError, Failure, InputError, OptionError, OptionValueError
from cxrground.fields import option
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.predictions import PredictionWriter, other_dataset, read_source, source_path
from cxrground.ils.schema import read_dataset
from cxrground.io.files import atomic_write_text, sha256_file
from cxrground.io.film_ledger import FilmLedger, FilmState
from cxrground.io.image import DEFAULT_MAX_PIXELS, read_image
from cxrground.io.output_lock import locks_output
from cxrground.io.progress import progress_bar
from cxrground.models.base import IlsModel, IlsOutput, checkpoint_fingerprint, checkpoint_info, load_model
from cxrground.registry import backend_errors, backend_label, check_returned

__all__ = ["PROMPTS", "PredictRequest", "check_device", "check_same_source", "films_path", "predict_jobs",
           "predict_request", "predict_split", "prediction_files", "prediction_source", "prediction_summary",
           "run_recorded"]


_Job = tuple[str, list[dict[str, Any]]]


def _split_jobs(data: dict[str, Any], split: str, limit: int | None) -> tuple[list[_Job], int]:
    """(image path, pairs) per study of ``split`` in dataset order, cut after ``limit`` pairs; and the pair count."""
    jobs: list[_Job] = []
    n = 0
    for study in data[split].values():
        pairs = study["instruction_answer_pairs"]
        items = list(pairs.get("positive_pairs", [])) + list(pairs.get("negative_pairs", []))
        if limit is not None:
            items = items[: max(0, limit - n)]
        n += len(items)
        if items:
            jobs.append((study["image_path"], items))
    return jobs, n


def prediction_source(checkpoint: Path, dataset: Path, split: str, prompts: str = "pairs",
                      images: Path | None = None) -> dict[str, str]:
    """What a predictions file is made from: the checkpoint (path, :func:`checkpoint_fingerprint`), the dataset JSON
    (path, sha256), the split and the instructions given (``prompts``: :data:`PROMPTS`), and the image root
    (``images``, resolved; None: the dataset's folder). Two runs with equal fingerprints, dataset sha256, split and
    prompts predict the same pairs with the same inputs, if the films are the same."""
    if prompts not in PROMPTS:
        raise ConfigError(f"prompts must be one of {', '.join(PROMPTS)}, got {prompts!r}")
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    if json_path.is_dir():
        raise InputError("is a folder, not the dataset JSON file", json_path)
    if not json_path.is_file():
        raise InputError("dataset JSON not found", json_path)
    root = images if images is not None else json_path.parent
    return {"checkpoint": str(checkpoint), "fingerprint": checkpoint_fingerprint(checkpoint),
            "dataset": str(json_path), "dataset_sha256": sha256_file(json_path), "split": split, "prompts": prompts,
            "images": str(Path(root).resolve())}


#: The fields of ``<out>.checkpoint.json`` a rerun must match, with how a refusal names them.
_SOURCE_KEYS: tuple[tuple[str, str], ...] = (("fingerprint", "checkpoint"), ("dataset_sha256", "dataset"),
                                             ("split", "split"), ("prompts", "instructions"))
#: The instructions a predictions file holds masks for: each pair's own (``ils predict``) or the CheXpercept
#: candidate instruction of each positive candidate (``percept candidates``, CHEXPERCEPT.md §2).
PROMPTS: tuple[str, str] = ("pairs", "chexpercept-candidates")


def _differences(before: dict[str, Any], source: dict[str, str]) -> list[str]:
    """How ``source`` differs from the recorded ``before``, one phrase per field (empty when they match)."""
    out = []
    for key, what in _SOURCE_KEYS:
        have, want = before.get(key, "pairs" if key == "prompts" else None), source.get(key)
        if have == want:
            continue
        if have is None:
            out.append(f"an unrecorded {what} (OUT.checkpoint.json does not name it)")
        elif key == "fingerprint":
            out.append(f"another checkpoint ({before.get('checkpoint', '?')}, fingerprint {str(have)[:12]}; this "
                       f"one {source['checkpoint']}, {str(want)[:12]})")
        elif key == "dataset_sha256":
            out.append(other_dataset(before, source["dataset"], str(want)) or f"another {what}")
        else:
            out.append(f"another {what} ({have}; this one {want})")
    return out


def check_same_source(out: Path, source: dict[str, str]) -> str | None:
    """Refuse (:class:`OptionError`) to add to predictions ``out`` made from another checkpoint, dataset or split
    (``source``: :func:`prediction_source`), or whose record does not say; record ``source`` beside ``out`` for the
    next run. When ``out`` holds no prediction yet, the failures of an earlier run for another source are
    dropped. Returns a note when ``out`` keeps predictions made from the films of another image root."""
    side = source_path(out)
    failures = out.with_name(out.name + ".failures.jsonl")
    before = read_source(out)
    differs = _differences(before, source) if before is not None else [f"an unknown source (no {side.name})"]
    if differs and out.is_file() and out.stat().st_size > 0:
        raise OptionError(f"{out} holds predictions of {'; '.join(differs)}: write to another --out, or "
                          f"{_delete_to_start_afresh(out)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if differs and before is not None:
        failures.unlink(missing_ok=True)  # no prediction kept: the failures of the other source go too
    note = None
    old_root = (before or {}).get("images")
    if (not differs and out.is_file() and out.stat().st_size > 0 and old_root is not None
            and old_root != source.get("images")):
        if films_path(out).is_file():
            note = (f"note: the predictions already in {out} were made from the films under {old_root}; this run "
                    f"reads {source.get('images')}: each film is compared with the one its predictions were made "
                    "from, and a film that differs is predicted again")
        else:  # predictions of a version that did not record their films
            note = (f"note: the predictions already in {out} were made from the films under {old_root}; this run "
                    f"reads {source.get('images')} (their films were not recorded, so they are not compared: "
                    f"{_delete_to_start_afresh(out)} from these)")
            source = {**source, "images": old_root}  # the record keeps naming where the kept predictions came from
    atomic_write_text(side, json.dumps(source, indent=2) + "\n")
    return note


def predict_split(model: IlsModel, dataset: Path, images: Path | None, split: str, out: Path,
                  limit: int | None = None, batch_size: int = 8, progress: bool = True,
                  mode: str = "free", max_pixels: int | None = DEFAULT_MAX_PIXELS) -> dict[str, Any]:
    """Predict every pair of ``split`` (or the first ``limit``) into the JSONL ``out``; resumable.

    ``mode`` (``free`` | ``teacher-forced``, recorded on every line) picks the model's ``predict_batch`` or its
    ``predict_teacher_forced`` (masks from the ground-truth answers' ``[SEG]``, ILS.md §15.1).

    ``images``: the root the pairs' image paths are relative to (None: the dataset's folder). Pairs already in
    ``out`` are skipped. An unreadable image (or one over ``max_pixels``, or one the model refuses) is recorded
    in ``<out>.failures.jsonl`` (replacing its record from an earlier run) and the remaining pairs go on.
    A model that fails (an error of its own, or an output that is not an ``IlsOutput`` with a mask at the image's
    native size) fails that image's pairs the same way, naming the model.
    Returns counts of written, skipped and failed pairs, and ``model_error``: the first such model failure (or
    None).
    """
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    images = images if images is not None else json_path.parent
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    data = read_dataset(json_path, splits=(split,))
    if split not in data:
        raise InputError(f"split {split!r} not in the dataset", json_path)
    jobs, _n = _split_jobs(data, split, limit)
    return predict_jobs(model, jobs, images, out, batch_size=batch_size, progress=progress, mode=mode,
                        max_pixels=max_pixels)


def predict_jobs(model: IlsModel, jobs: list[tuple[str, list[dict[str, Any]]]], images: Path, out: Path,
                 batch_size: int = 8, progress: bool = True, mode: str = "free",
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> dict[str, Any]:
    """Predict ``jobs`` (per image path relative to ``images``: its items, each with ``pair_id`` and
    ``instruction``, and ``answer`` for the teacher-forced mode) into the JSONL ``out``, one line per item with the
    instruction it was given; resumable and failure-recording as :func:`predict_split` describes. Returns counts
    of written, skipped and failed items, and ``model_error``."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    n = sum(len(items) for _rel, items in jobs)
    failures_path = out.with_name(out.name + ".failures.jsonl")
    counts: dict[str, Any] = {"pairs": n, "written": 0, "skipped": 0, "failed": 0, "model_error": None}
    run = _mode_runner(model, mode)
    ledger = FilmLedger(films_path(out))
    with PredictionWriter(out, seg_mode=mode) as writer:
        verdicts = _compare_films(jobs, images, writer.done, ledger, progress)
        writer.forget({p["pair_id"] for rel, items in jobs if rel in verdicts["changed"] for p in items})
        counts.update({f"films_{verdict}": len(rels) for verdict, rels in verdicts.items()})
        todo = [(rel, [p for p in items if p["pair_id"] not in writer.done]) for rel, items in jobs]
        counts["skipped"] = n - sum(len(items) for _r, items in todo)
        retried = {p["pair_id"] for _r, items in todo for p in items}
        _forget_failures(failures_path, {str(images / rel) for rel, items in todo if items},
                         retried | set(writer.done))
        bar = progress_bar(total=n - counts["skipped"], desc="predict", unit="pair", progress=progress)
        for rel, items in todo:
            if not items:
                continue
            try:
                try:  # before the read: a film replaced meanwhile is found changed next time, not taken as read
                    state: FilmState | None = FilmState.of(images / rel)
                except OSError:
                    state = None  # the read below says why
                image = read_image(images / rel, max_pixels=max_pixels)
                if state is not None:
                    ledger.record(rel, state)
                for b in range(0, len(items), batch_size):
                    chunk = items[b:b + batch_size]
                    with backend_errors("model", model, "predict"):
                        results = run([image] * len(chunk), chunk)
                    results = _checked_outputs(model, results, chunk, image.pixels.shape, images / rel)
                    for pair, res in zip(chunk, results, strict=True):
                        writer.write(pair["pair_id"], res.answer, res.mask, pair["instruction"])
                        counts["written"] += 1
                    bar.update(len(chunk))
            except (InputError, BackendError, ValueError, RuntimeError, MemoryError) as exc:  # one image's failure
                left = [p for p in items if p["pair_id"] not in writer.done]
                counts["failed"] += len(left)
                if isinstance(exc, BackendError) and counts["model_error"] is None:
                    counts["model_error"] = str(exc)
                bar.update(len(left))
                record = {**Failure.from_exception((images / rel).absolute(), "predict", exc).to_dict(),
                          "pair_ids": [p["pair_id"] for p in left]}
                with failures_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
        bar.close()
    return counts


def prediction_files(out: Path) -> list[Path]:
    """The files of the predictions output ``out`` that exist: the predictions, the record of their source
    (``<out>.checkpoint.json``), the failures (``<out>.failures.jsonl``) and the film ledger (:func:`films_path`)."""
    files = (out, out.with_name(out.name + ".checkpoint.json"), out.with_name(out.name + ".failures.jsonl"),
             films_path(out))
    return [path for path in files if path.is_file()]


def _delete_to_start_afresh(out: Path) -> str:
    """``delete <the files of out that exist> to predict afresh``, for a refusal or a note."""
    names = [str(path) for path in prediction_files(out)]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"delete {listed} to predict afresh"


def films_path(out: Path) -> Path:
    """The film ledger beside the predictions file ``out`` (``<out>.films.jsonl``): what each film was when its
    pairs were predicted (:class:`~cxrground.io.film_ledger.FilmLedger`)."""
    return out.with_name(out.name + ".films.jsonl")


def _compare_films(jobs: list[_Job], images: Path, done: set[str], ledger: FilmLedger,
                   progress: bool) -> dict[str, set[str]]:
    """The films (paths relative to ``images``) with kept predictions (pair ids in ``done``) that changed since,
    are no longer there, or were not recorded (by verdict, :meth:`FilmLedger.compare`)."""
    kept = [rel for rel, items in jobs if any(p["pair_id"] in done for p in items)]
    verdicts: dict[str, set[str]] = {"changed": set(), "missing": set(), "unrecorded": set()}
    for rel in progress_bar(kept, desc="compare films", unit="film", progress=progress and bool(kept)):
        verdict = ledger.compare(rel, images / rel)
        if verdict != "same":
            verdicts[verdict].add(rel)
    return verdicts


@dataclass(frozen=True, kw_only=True)
class PredictRequest:
    """A split to predict with a checkpoint, how to load the model, and where the predictions go (each field
    documents itself, :func:`cxrground.fields.option`; ``cxrground ils predict`` offers one option per field)."""

    checkpoint: Path = option(path="existing", help="Checkpoint folder (checkpoint.json names the backend).")
    dataset: Path = option(path="existing", help="ILS dataset folder or its JSON file.")
    images: Path | None = option(None, path="dir",
                                 help="Image root (MIMIC-CXR-JPG files/). Default: the dataset folder.")
    split: str = option("test", choices=("train", "val", "test"), help="Split whose pairs are predicted.")
    out: Path = option(path="out_file", help="Predictions JSONL (appended to; pairs already there are skipped when "
                       "they come from the same checkpoint, dataset and split, recorded in OUT.checkpoint.json; "
                       "another one is refused).")
    limit: int | None = option(None, low=1, help="Predict only the first N pairs of the split.")
    batch_size: int = option(8, low=1, help="Pairs per forward pass.")
    device: str = option("cpu", help="torch device: cpu, cuda, cuda:1, mps ...")
    mode: str = option("free", choices=("free", "teacher-forced"), help="Masks from the generated [SEG] (free) or "
                       "from the ground-truth answer's [SEG] (teacher-forced, the paper's segmentation protocol; LISA "
                       "only). Recorded in the predictions file.")
    quantize: str = option("none", choices=("none", "8bit", "4bit"),
                           help="LISA: load the language model in 8-bit or 4-bit (bitsandbytes; needs CUDA).")
    device_map: str | None = option(None, help="LISA: 'auto' or a JSON {module prefix: device} to spread a large "
                                    "checkpoint over devices (accelerate).")
    max_pixels: int = option(DEFAULT_MAX_PIXELS, low=1, show_default=True, help="Images whose header states more "
                             "pixels are recorded as failures without being decoded.")


def predict_request(request: PredictRequest, progress: bool = True) -> str:
    """Load the checkpoint, predict the split into ``request.out`` (resuming) and say what was written."""
    r = request
    check_device(r.device)
    return run_recorded(r.out, prediction_source(r.checkpoint, r.dataset, r.split, images=r.images),
                        lambda: _predict_and_say(r, progress))


@locks_output("predictions", "out")
def run_recorded(out: Path, source: dict[str, str], predict: Callable[[], str]) -> str:
    """Run ``predict`` (which writes predictions into ``out`` and says what it wrote) once ``source`` is checked
    against and recorded as what ``out`` is made from (:func:`check_same_source`); a run that fails before it
    wrote a prediction leaves no record of its source."""
    side = out.with_name(out.name + ".checkpoint.json")
    had_side = side.is_file()
    note = check_same_source(out, source)
    try:
        said = predict()
        return f"{said}\n{note}" if note else said
    except BaseException as exc:
        if not had_side and not (out.is_file() and out.stat().st_size > 0):
            side.unlink(missing_ok=True)
        if note:
            exc.add_note(note)
        raise


def _predict_and_say(r: PredictRequest, progress: bool) -> str:
    """The prediction of :func:`predict_request` once the source is checked: the line saying what was written,
    or an error when nothing could be."""
    model = load_model(r.checkpoint, device=r.device, **_loading_options(r))
    counts = predict_split(model, r.dataset, r.images, r.split, r.out, limit=r.limit, batch_size=r.batch_size,
                           progress=progress, mode=r.mode, max_pixels=r.max_pixels)
    root = r.images if r.images is not None else r.dataset
    return prediction_summary(counts, r.out, f"of split {r.split!r}", root, r.mode)


def prediction_summary(counts: dict[str, Any], out: Path, what: str, root: Path, mode: str = "free",
                       unit: str = "pairs") -> str:
    """The line saying what a prediction run (``counts`` of :func:`predict_jobs`) wrote into ``out``; when every
    item failed, a :class:`BackendError` (the model failed) or an :class:`InputError` naming the image ``root``
    (no image ``what`` could be read)."""
    line = (f"{out}: {counts['written']} written, {counts['skipped']} already there, {counts['failed']} failed "
            f"(of {counts['pairs']} {unit}; mode {mode})")
    line += "".join(f"\n{text}" for text in _film_lines(counts, root, unit))
    if counts["failed"] and not counts["written"] and not counts["skipped"]:
        reasons = out.with_name(out.name + ".failures.jsonl")
        if counts["model_error"] is not None:
            raise BackendError(f"{line}: the model failed; the first reason: {counts['model_error']} (every reason "
                               f"is in {reasons})")
        raise InputError(f"{line}: no image {what} could be read under this image root (a wrong --images?); the "
                         f"reasons are in {reasons}", root)
    return line


def _film_lines(counts: dict[str, Any], root: Path, unit: str) -> list[str]:
    """What a prediction run found of the films of its kept predictions (``counts`` of :func:`predict_jobs`)."""
    lines = []
    if counts.get("films_changed"):
        lines.append(f"  {counts['films_changed']} film(s) changed since their {unit} were predicted: predicted again")
    if counts.get("films_missing"):
        lines.append(f"  {counts['films_missing']} film(s) with kept predictions are not under {root} now: their "
                     "predictions are kept, not compared")
    if counts.get("films_unrecorded"):
        lines.append(f"  {counts['films_unrecorded']} film(s) with kept predictions were not recorded when predicted "
                     "(an earlier version): not compared")
    return lines


def _checked_outputs(model: IlsModel, results: Any, pairs: list[dict[str, Any]], shape: tuple[int, ...],
                     image: Path) -> list[IlsOutput]:
    """``results`` (the model's outputs for ``pairs`` of one image) when each is an ``IlsOutput`` (or has its
    ``answer`` and ``mask``) whose mask has the image's native ``shape``; else a :class:`BackendError` naming the
    model, the image, the pair and both shapes."""
    results = list(check_returned("model", model, "predict", results, (list, tuple), "a list of IlsOutput"))
    if len(results) != len(pairs):
        raise BackendError(f"{backend_label('model', model)}: predict returned {len(results)} outputs for "
                           f"{len(pairs)} instructions on {image}")
    for pair, res in zip(pairs, results, strict=True):
        if not (hasattr(res, "answer") and hasattr(res, "mask")):
            raise BackendError(f"{backend_label('model', model)}: predict returned {type(res).__name__}, expected "
                               "IlsOutput (an answer and a mask)")
        got = tuple(int(v) for v in np.shape(res.mask))
        if res.mask is not None and got != tuple(int(v) for v in shape[:2]):
            raise BackendError(f"{backend_label('model', model)}: the mask of pair {pair['pair_id']} on {image} has "
                               f"shape {got}, expected {tuple(int(v) for v in shape[:2])} (the image's native size)")
    return results


#: Backends that take the loading options ``quantize`` and ``device_map``.
_LOADING_OPTION_BACKENDS = ("lisa",)


def _loading_options(request: PredictRequest) -> dict[str, Any]:
    """The backend loading options given (``quantize``, ``device_map``); an :class:`OptionError` when the
    checkpoint's backend takes none."""
    given = {k: v for k, v in (("quantize", request.quantize), ("device_map", request.device_map))
             if v not in (None, "none")}
    backend = checkpoint_info(request.checkpoint)["model"] if given else None
    if given and backend not in _LOADING_OPTION_BACKENDS:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in given)
        raise OptionError(f"{flags}: for LISA checkpoints only; {request.checkpoint} is a {backend!r} checkpoint")
    return given


def check_device(device: str) -> None:
    """An :class:`OptionValueError` for a device string torch does not know."""
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise OptionValueError(f"--device {device!r} is not a torch device ({exc})") from None


def _forget_failures(path: Path, retried: set[str], pair_ids: set[str]) -> None:
    """Drop the records of ``path`` that name a pair of ``pair_ids`` (those this run retries, which are recorded
    again if they fail, and those that have a prediction), whatever image root they were recorded under; a record
    without pair ids is dropped when its image is one of ``retried``."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a partial line left by a kill
        if not isinstance(record, dict):
            continue
        ids = record.get("pair_ids")
        stale = pair_ids.intersection(ids) if isinstance(ids, list) else record.get("path") in retried
        if not stale:
            keep.append(json.dumps(record) + "\n")
    atomic_write_text(path, "".join(keep))


def _mode_runner(model: IlsModel, mode: str) -> Any:
    """``(images, pairs) -> outputs`` for a segmentation mode; a backend without teacher forcing is refused."""
    if mode == "free":
        return lambda images, pairs: model.predict_batch(images, [p["instruction"] for p in pairs])
    if mode != "teacher-forced":
        raise ConfigError(f"mode must be 'free' or 'teacher-forced', got {mode!r}")
    if not hasattr(model, "predict_teacher_forced"):
        raise ConfigError(f"the {getattr(model, 'name', '?')} backend has no teacher-forced mode (its masks do not "
                          "come from a generated [SEG]); use --mode free")
    return lambda images, pairs: model.predict_teacher_forced(images, [p["instruction"] for p in pairs],
                                                              [p["answer"] for p in pairs])
