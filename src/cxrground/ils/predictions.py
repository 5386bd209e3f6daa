"""Model predictions for an ILS split: reading the JSONL file and decoding its masks.

Format (one JSON object per line, one line per evaluated pair; blank lines are ignored)::

    {"pair_id": "s10000000_positive_0", "answer": "<generated text>",
     "mask": {"size": [H, W], "counts": "..."}}
    {"pair_id": "s10000000_negative_0", "answer": "<generated text>",
     "mask_path": "masks/s10000000_negative_0.png"}

- ``pair_id`` (required): the MIMIC-ILS pair id.
- ``answer`` (optional): the generated text. Either the bare answer or the whole decoded sequence;
  the part after the last ``ASSISTANT:`` and before ``</s>`` is used (ILS.md §15.2).
- ``mask`` (optional): COCO RLE of the binary prediction at the image's **native** ``H×W``
  (compressed string or uncompressed list counts; its declared size is checked against the image before it is
  decoded, and runs that are negative or do not cover exactly ``H×W`` are an error naming the line), or
  ``null``: an empty prediction on a negative pair (on a positive pair it counts as missing), or
- ``mask_path`` (optional): a 0/255 (or 0/1) single-channel PNG, path relative to the predictions file.
- ``seg_mode`` (optional): how the mask was made, one of :data:`SEG_MODES`: ``free`` (from the ``[SEG]`` the
  model generated) or ``teacher-forced`` (from the ``[SEG]`` of the ground-truth answer, the paper's
  segmentation protocol, ILS.md §15.1). ``cxrground ils predict`` writes it on every line; one file holds one
  mode (:class:`PredictionWriter` refuses to append another) and ``ils evaluate`` reports it
  (:func:`resolve_seg_mode`).
- ``instruction`` (optional): the instruction the model was given for this line. ``ils predict`` writes the pair's
  own instruction; ``percept candidates`` the CheXpercept candidate instruction (CHEXPERCEPT.md §2), which
  ``percept build --candidates`` checks.

``<file>.checkpoint.json`` (:func:`source_path`, written by ``ils predict`` and ``percept candidates``) records what
the file was made from, among it the dataset JSON's path and sha256 (``dataset``, ``dataset_sha256``). Pair ids
repeat between datasets (the same cohort built with another seed), so a file made for another dataset is refused
(:func:`other_dataset`; without that record, by the instructions its lines record: :func:`instruction_mismatches`).

A mask whose size differs from the native image size raises :class:`~cxrground.errors.MaskShapeError`
naming the pair. A pair without a line (or a line without mask / answer) is listed as missing and
counts as wrong: IoU 0 for a positive, "not empty" for a negative, text wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import InputError, MaskError, MaskShapeError
from cxrground.io.files import atomic_write_text, cut_torn_tail
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.io.masks import decode_rle, encode_rle, read_mask_png, rle_size

__all__ = ["SEG_MODES", "Prediction", "PredictionWriter", "instruction_mismatches", "load_predictions",
           "other_dataset", "prediction_line", "read_source", "recorded_seg_mode", "resolve_seg_mode", "source_path",
           "unused_reasons"]

#: How a prediction's mask was made (ILS.md §15.1): free generation or the teacher-forced pass.
SEG_MODES: tuple[str, str] = ("free", "teacher-forced")
#: The mode stated when neither the user nor the predictions file says.
UNSPECIFIED = "unspecified"


@dataclass(frozen=True)
class Prediction:
    """One prediction line; the mask is decoded on demand (:meth:`mask_array`)."""

    pair_id: str
    answer: str | None = None
    rle: Mapping[str, Any] | None = None
    mask_path: Path | None = None
    seg_mode: str | None = None
    instruction: str | None = None
    """The instruction the mask was predicted for, when the line records it."""
    null_mask: bool = False
    """The line states ``"mask": null`` (an empty prediction on a negative pair)."""
    line: int | None = None
    """Line number in ``source`` (named in errors)."""
    source: Path | None = None

    @property
    def has_mask(self) -> bool:
        """True when the line gives a mask (RLE or PNG)."""
        return self.rle is not None or self.mask_path is not None

    def mask_array(self, shape: Sequence[int] | None = None) -> np.ndarray | None:
        """The predicted bool mask (None when the line has none); checks ``shape`` when given, before decoding.

        Without ``shape``, an RLE declaring more than :data:`~cxrground.io.image.DEFAULT_MAX_PIXELS` is refused.
        """
        what = f"prediction mask of pair {self.pair_id}"
        if self.line is not None:
            what = f"line {self.line}: {what}"
        if self.rle is not None:
            try:
                if shape is None and (size := rle_size(self.rle))[0] * size[1] > DEFAULT_MAX_PIXELS:
                    raise MaskError(f"declares {size[0]}x{size[1]} pixels, over the limit of {DEFAULT_MAX_PIXELS} "
                                    "(not decoded)")
                return decode_rle(self.rle, shape)
            except MaskShapeError as exc:
                raise MaskShapeError(exc.expected, exc.got, what, self.source) from exc
            except MaskError as exc:
                raise MaskError(f"{what}: {exc.reason}", self.source) from exc
        if self.mask_path is not None:
            try:
                return read_mask_png(self.mask_path, shape)
            except MaskShapeError as exc:
                raise MaskShapeError(exc.expected, exc.got, what, self.mask_path) from exc
        return None


def load_predictions(path: str | Path) -> dict[str, Prediction]:
    """Read a predictions JSONL file (format in the module docstring) keyed by pair id."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise InputError("predictions file not found", path) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"predictions file is not UTF-8 ({exc})", path) from exc
    out: dict[str, Prediction] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"line {lineno}: not valid JSON ({exc})", path) from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("pair_id"), str):
            raise InputError(f"line {lineno}: expected an object with a string 'pair_id'", path)
        pid = obj["pair_id"]
        if pid in out:
            raise InputError(f"line {lineno}: duplicate prediction for pair {pid}", path)
        answer = obj.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise InputError(f"line {lineno}: 'answer' of pair {pid} must be a string", path)
        rle = obj.get("mask")
        mask_path = obj.get("mask_path")
        if rle is not None and mask_path is not None:
            raise InputError(f"line {lineno}: pair {pid} gives both 'mask' and 'mask_path'", path)
        if rle is not None and not isinstance(rle, dict):
            raise InputError(f"line {lineno}: 'mask' of pair {pid} must be a COCO RLE object", path)
        if mask_path is not None and not isinstance(mask_path, str):
            raise InputError(f"line {lineno}: 'mask_path' of pair {pid} must be a string", path)
        seg_mode = obj.get("seg_mode")
        if seg_mode is not None and seg_mode not in SEG_MODES:
            raise InputError(f"line {lineno}: 'seg_mode' of pair {pid} must be one of {SEG_MODES}", path)
        instruction = obj.get("instruction")
        if instruction is not None and not isinstance(instruction, str):
            raise InputError(f"line {lineno}: 'instruction' of pair {pid} must be a string", path)
        out[pid] = Prediction(
            pair_id=pid,
            answer=answer,
            rle=rle,
            mask_path=(path.parent / mask_path) if mask_path is not None else None,
            seg_mode=seg_mode,
            instruction=instruction,
            null_mask="mask" in obj and rle is None and mask_path is None,
            line=lineno,
            source=path,
        )
    return out


def source_path(predictions: str | Path) -> Path:
    """``<predictions>.checkpoint.json``: the record of what a predictions file was made from."""
    predictions = Path(predictions)
    return predictions.with_name(predictions.name + ".checkpoint.json")


def read_source(predictions: str | Path) -> dict[str, Any] | None:
    """The record beside ``predictions`` (:func:`source_path`): None when there is none, ``{}`` when it cannot be
    read or is not a JSON object."""
    side = source_path(predictions)
    if not side.is_file():
        return None
    try:
        record = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def other_dataset(record: Mapping[str, Any], dataset: str | Path, sha256: str) -> str | None:
    """"another dataset (RECORDED, sha256 …; this one DATASET, …)" when ``record`` (:func:`read_source`) names a
    dataset JSON of another sha256 than ``sha256`` (that of ``dataset``); None when it names this one or none."""
    have = record.get("dataset_sha256")
    if have is None or have == sha256:
        return None
    return (f"another dataset ({record.get('dataset', '?')}, sha256 {str(have)[:12]}; this one {dataset}, "
            f"{sha256[:12]})")


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def instruction_mismatches(preds: Mapping[str, Prediction], pairs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Pair ids of ``pairs`` (dataset pairs, with ``pair_id`` and ``instruction``) whose prediction records another
    instruction (whitespace runs compared as one space); a prediction without one is not compared."""
    out = []
    for pair in pairs:
        pred = preds.get(pair["pair_id"])
        if pred is not None and pred.instruction is not None and not _same_text(pred.instruction,
                                                                               str(pair["instruction"])):
            out.append(pair["pair_id"])
    return out


def recorded_seg_mode(preds: Mapping[str, Prediction], path: str | Path | None = None) -> str | None:
    """The one segmentation mode the predictions record (None when no line records one; mixed modes are an error)."""
    modes = sorted({p.seg_mode for p in preds.values() if p.seg_mode is not None})
    if len(modes) > 1:
        raise InputError(f"predictions mix segmentation modes {modes}; write each mode to its own file", path)
    return modes[0] if modes else None


def resolve_seg_mode(stated: str | None, preds: Mapping[str, Prediction], path: str | Path | None = None) -> str:
    """The mode a report states: the recorded one, else ``stated``; a stated mode contradicting the file is an error."""
    recorded = recorded_seg_mode(preds, path)
    if stated in (None, "", UNSPECIFIED):
        return recorded or UNSPECIFIED
    if recorded is not None and stated != recorded:
        raise InputError(f"segmentation mode {stated!r} stated, but the predictions were made in mode "
                         f"{recorded!r}", path)
    return str(stated)


def prediction_line(pair_id: str, answer: str | None, mask: np.ndarray | None,
                    seg_mode: str | None = None, instruction: str | None = None) -> dict[str, Any]:
    """One predictions-file record: the pair id, the answer text, the native-size mask as COCO RLE, the mode and
    the instruction the model was given."""
    line: dict[str, Any] = {"pair_id": pair_id, "answer": answer}
    if mask is not None:
        line["mask"] = encode_rle(np.asarray(mask, dtype=bool))
    if seg_mode is not None:
        line["seg_mode"] = seg_mode
    if instruction is not None:
        line["instruction"] = instruction
    return line


class PredictionWriter:
    """Append-only predictions JSONL writer; reopening an existing file resumes after its last full line.

    ``done`` holds the pair ids already written, so a killed ``predict`` run skips them on restart. With
    ``seg_mode`` every line records it, and a file already holding another mode is refused.
    """

    def __init__(self, path: str | Path, seg_mode: str | None = None) -> None:
        if seg_mode is not None and seg_mode not in SEG_MODES:
            raise ValueError(f"seg_mode must be one of {SEG_MODES}, got {seg_mode!r}")
        self.path = Path(path)
        self.seg_mode = seg_mode
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: set[str] = set()
        if self.path.exists():
            cut_torn_tail(self.path)  # a partial last line left by a kill
            existing = load_predictions(self.path)
            recorded = recorded_seg_mode(existing, self.path)
            if recorded is not None and seg_mode != recorded:
                raise InputError(f"holds predictions of segmentation mode {recorded!r}; cannot append mode "
                                 f"{seg_mode or UNSPECIFIED!r} (write to another file)", self.path)
            self.done = set(existing)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, pair_id: str, answer: str | None, mask: np.ndarray | None,
              instruction: str | None = None) -> None:
        """Write one prediction (with the instruction it was made for, when given) and flush it to disk."""
        if pair_id in self.done:
            raise InputError(f"pair {pair_id} already has a prediction", self.path)
        self._fh.write(json.dumps(prediction_line(pair_id, answer, mask, self.seg_mode, instruction)) + "\n")
        self._fh.flush()
        self.done.add(pair_id)

    def forget(self, pair_ids: set[str]) -> int:
        """Remove the predictions of ``pair_ids`` from the file (rewritten atomically), so they can be written
        again; returns how many lines went."""
        gone = pair_ids & self.done
        if not gone:
            return 0
        self._fh.close()
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True)
                if not line.strip() or json.loads(line)["pair_id"] not in gone]
        atomic_write_text(self.path, "".join(kept))
        self.done -= gone
        self._fh = self.path.open("a", encoding="utf-8")
        return len(gone)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pair_ids(study: Mapping[str, Any]) -> list[str]:
    """Pair ids of a study in evaluation order (positives, then negatives)."""
    pairs = study.get("instruction_answer_pairs") or {}
    return [p["pair_id"] for kind in ("positive_pairs", "negative_pairs") for p in pairs.get(kind, [])]


def unused_reasons(studies: Iterable[tuple[str, Mapping[str, Any]]], predicted: Sequence[str], split: str,
                   n_scored: int) -> dict[str, int]:
    """Why predictions went unscored, as ``{reason: count}``, when the first ``n_scored`` pairs of ``split``
    (``"all"``: every split, in file order) were scored: a pair id the dataset does not have, a pair of another
    split, a pair past the ``--limit``. ``studies``: ``(split, study)`` of every study of the dataset in file order
    (a stream is read once; only the predicted pair ids are kept)."""
    wanted = set(predicted)
    seen = 0  # pairs of the scored split(s) so far, in scoring order
    where: dict[str, str] = {}  # predicted pair id -> "scored" | "limited" | the split it belongs to
    for name, study in studies:
        for pid in _pair_ids(study):
            if split in ("all", name):
                seen += 1
                if pid in wanted and where.get(pid) != "scored":
                    where[pid] = "scored" if seen <= n_scored else "limited"
            elif pid in wanted:
                where.setdefault(pid, name)
    reasons: dict[str, int] = {}
    for pid in dict.fromkeys(predicted):
        state = where.get(pid)
        if state == "scored":
            continue
        if state == "limited":
            reason = "past --limit"
        elif state is not None:
            reason = f"pairs of split {state}"
        else:
            reason = "pair ids not in the dataset"
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons
