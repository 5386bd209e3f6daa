"""The MIMIC-ILS JSON schema (ILS.md §12.2) as pydantic models, plus validation of a whole file.

``{ "train" | "val" | "test": { "s{study_id}": Study } }``. Extra fields are allowed on studies and
pairs (consumers must ignore unknown fields); the ones this generator adds are ``certainty`` and
``kind`` on pairs.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import ijson
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cxrground.errors import InputError
from cxrground.ils.layout import DATASET_FILE, UNITS_DIR
from cxrground.reports.model import SectionName
from cxrground.vocab.ils_templates import SEG_TOKEN
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import BOTH_LUNGS, HEART, ILS_LOCATION_LABELS

__all__ = [
    "SPLITS",
    "DatasetFile",
    "NegativePair",
    "PairSet",
    "PositivePair",
    "Study",
    "check_splits",
    "dataset_location",
    "dataset_splits",
    "iter_dataset",
    "load_dataset",
    "load_dataset_file",
    "read_dataset",
    "structure_problems",
    "validate_dataset",
]

SPLITS: tuple[str, str, str] = ("train", "val", "test")
_LOCATIONS = frozenset((*ILS_LOCATION_LABELS, HEART, BOTH_LUNGS))


class _Pair(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    pair_id: str
    instruction: str
    answer: str
    type: Literal["basic", "global", "lesion_inference"]
    target: str

    @field_validator("target")
    @classmethod
    def _lesion(cls, v: str) -> str:
        if v not in LESIONS:
            raise ValueError(f"target {v!r} is not one of the 7 lesions")
        return v

    @field_validator("answer")
    @classmethod
    def _seg_first(cls, v: str) -> str:
        if not v.startswith(SEG_TOKEN) or v.count(SEG_TOKEN) != 1:
            raise ValueError(f"answer must start with exactly one {SEG_TOKEN}: {v!r}")
        return v

    @field_validator("instruction")
    @classmethod
    def _period(cls, v: str) -> str:
        if not v.endswith(".") or v.endswith(".."):
            raise ValueError(f"instruction must end with a single '.': {v!r}")
        return v


def _check_labels(labels: list[str], what: str) -> list[str]:
    bad = [lab for lab in labels if lab not in _LOCATIONS]
    if bad or not labels:
        raise ValueError(f"{what} has unknown or no labels: {bad or labels}")
    return labels


class PositivePair(_Pair):
    """A pair whose answer has a mask."""

    reported_location: list[str]
    grounded_location: list[str]
    location: list[str] | None = None
    """The location the pair names, as the released MIMIC-ILS sample's positives carry it (not in ILS.md §12.2's
    table); cxrground writes the grounded location here."""
    sent_idx: str
    seg: Literal[True]
    seg_mask_path: str

    @field_validator("reported_location", "grounded_location")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        return _check_labels(v, "location")

    @field_validator("location")
    @classmethod
    def _named(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _check_labels(v, "location")

    @field_validator("sent_idx")
    @classmethod
    def _digits(cls, v: str) -> str:
        if not v.isdigit():
            raise ValueError(f"sent_idx must be a decimal string, got {v!r}")
        return v


class NegativePair(_Pair):
    """A pair whose answer is an empty mask."""

    location: list[str]
    seg: Literal[False]
    seg_mask_path: None = None

    @field_validator("location")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        return _check_labels(v, "location")


class PairSet(BaseModel):
    """``instruction_answer_pairs`` of a study."""

    model_config = ConfigDict(extra="allow", frozen=True)

    positive_pairs: list[PositivePair] = Field(default_factory=list)
    negative_pairs: list[NegativePair] = Field(default_factory=list)


class Study(BaseModel):
    """One study entry."""

    model_config = ConfigDict(extra="allow", frozen=True)

    subject_id: str
    dicom_id: str
    image_path: str
    section_name: SectionName
    """``findings`` / ``impression`` / ``last_paragraph`` (ILS §6), or ``findings+impression`` for a dataset built
    with that section policy (not in the released MIMIC-ILS, whose loaders do not read this field)."""
    section_content: str
    instruction_answer_pairs: PairSet

    @model_validator(mode="after")
    def _pair_ids(self) -> Study:
        for kind, pairs in (("positive", self.instruction_answer_pairs.positive_pairs),
                            ("negative", self.instruction_answer_pairs.negative_pairs)):
            for i, p in enumerate(pairs):
                if not p.pair_id.endswith(f"_{kind}_{i}"):
                    raise ValueError(f"pair_id {p.pair_id!r} should end with _{kind}_{i}")
        return self


class DatasetFile(BaseModel):
    """The whole ``mimic_ils_instruction_answer.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: dict[str, Study] = Field(default_factory=dict)
    val: dict[str, Study] = Field(default_factory=dict)
    test: dict[str, Study] = Field(default_factory=dict)


def validate_dataset(data: dict[str, Any], mask_root: str | Path | None = None) -> list[str]:
    """Problems found in a dataset dict (schema, pair ids, mask files exist); empty when valid."""
    problems: list[str] = []
    try:
        parsed = DatasetFile.model_validate(data)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    for split in SPLITS:
        for key, study in getattr(parsed, split).items():
            if not key.startswith("s"):
                problems.append(f"{split}.{key}: study keys are 's{{study_id}}'")
            for p in study.instruction_answer_pairs.positive_pairs:
                if not p.pair_id.startswith(f"{key}_"):
                    problems.append(f"{split}.{key}.{p.pair_id}: pair id does not start with the study key")
                if not p.seg_mask_path.startswith(f"{key}/{key}_"):
                    problems.append(f"{split}.{key}.{p.pair_id}: mask path {p.seg_mask_path!r} not under {key}/")
                if mask_root is not None and not (Path(mask_root) / p.seg_mask_path).is_file():
                    problems.append(f"{split}.{key}.{p.pair_id}: mask file {p.seg_mask_path} missing")
    return problems


def _dataset_json(path: str | Path) -> Path:
    """``path``, or the dataset file in it when it is a dataset folder."""
    path = Path(path)
    return path / DATASET_FILE if path.is_dir() and (path / DATASET_FILE).is_file() else path


def dataset_location(path: str | Path) -> tuple[Path, Path]:
    """The folder and the JSON file of a dataset named by either: a folder holds :data:`DATASET_FILE`; a file is
    the JSON itself, and its folder (where the masks, units and card are) is the file's parent."""
    path = Path(path)
    return (path, path / DATASET_FILE) if path.is_dir() else (path.parent, path)


def _unfinished(folder: Path) -> str:
    """What to add to a missing-dataset message when ``folder`` holds an ``ils build`` that has not assembled its
    dataset (its settings and units, no dataset JSON); empty otherwise."""
    if (folder / "settings.json").is_file() and (folder / UNITS_DIR).is_dir():
        return (" (the folder holds an unfinished ils build, cut short or still running: rerun the same ils build "
                "to finish it)")
    return ""


def _readable_json(path: str | Path) -> Path:
    """The dataset JSON file of ``path`` (:func:`_dataset_json`), or an :class:`InputError` when it is a folder or
    missing."""
    path = _dataset_json(path)
    if path.is_dir():
        raise InputError("is a folder, not the dataset JSON file" + _unfinished(path), path)
    if not path.exists():
        raise InputError("dataset JSON not found" + _unfinished(path.parent), path)
    return path


def load_dataset(path: str | Path) -> dict[str, Any]:
    """Read a MIMIC-ILS JSON file (ours or the released one), or the one in a dataset folder, as a plain dict."""
    path = _readable_json(path)
    try:
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise InputError("the dataset JSON file is empty", path)
        return json.loads(text)
    except FileNotFoundError as exc:
        raise InputError("dataset JSON not found" + _unfinished(path.parent), path) from exc
    except OSError as exc:
        raise InputError(f"cannot read the dataset JSON ({exc.strerror or exc})", path) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON ({exc})", path) from exc
    except RecursionError as exc:
        raise InputError("not a usable MIMIC-ILS dataset: JSON nested too deeply", path) from exc



#: Pair fields every reader of a dataset uses (strings), and the one positive pairs add.
PAIR_FIELDS: Final[tuple[str, ...]] = ("pair_id", "instruction", "answer", "type", "target")
#: Fields readers use when present, by the JSON type they must then have: study fields, then pair fields.
_OPTIONAL_STUDY: Final[dict[str, type]] = {"subject_id": str, "dicom_id": str, "section_name": str,
                                           "section_content": str}
_OPTIONAL_PAIR: Final[dict[str, type]] = {"seg": bool, "sent_idx": str, "reported_location": list,
                                          "grounded_location": list, "location": list}
_JSON_NAMES: Final[dict[type, str]] = {str: "a string", bool: "true or false", list: "a list of location labels"}
_SHOWN: Final[int] = 3


def _kind(value: Any) -> str:
    """The JSON name of ``value``'s type."""
    kinds = ((bool, "boolean"), (str, "string"), (int | float, "number"), (list, "array"), (dict, "object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def _object(value: Any, where: str) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{where} must be a JSON object, got {type(value).__name__}"


def _strings(record: dict[str, Any], fields: Sequence[str], where: str) -> Iterator[str]:
    for name in fields:
        if name not in record:
            yield f"{where} has no {name!r}"
        elif not isinstance(record[name], str):
            yield f"{where}: {name} must be a string, got {type(record[name]).__name__}"


def _optional(record: dict[str, Any], fields: dict[str, type], where: str) -> Iterator[str]:
    """Fields of ``fields`` that ``record`` has with another JSON type (a location list: strings only)."""
    for name, kind in fields.items():
        if record.get(name) is None:  # absent or null: the reader's default
            continue
        value = record[name]
        ok = isinstance(value, kind) and (kind is not list or all(isinstance(v, str) for v in value))
        if not ok:
            yield f"{where}: {name} must be {_JSON_NAMES[kind]}, got {_kind(value)}"


def _pair_problems(pair: Any, positive: bool, targets: Collection[str] | None, where: str) -> Iterator[str]:
    yield from _object(pair, where)
    if not isinstance(pair, dict):
        return
    yield from _strings(pair, (*PAIR_FIELDS, "seg_mask_path") if positive else PAIR_FIELDS, where)
    yield from _optional(pair, _OPTIONAL_PAIR, where)
    target = pair.get("target")
    if targets is not None and isinstance(target, str) and target not in targets:
        yield f"{where}: target {target!r} is not one of {', '.join(targets)}"


def _study_problems(study: Any, study_fields: Sequence[str], targets: Collection[str] | None,
                    where: str) -> Iterator[str]:
    yield from _object(study, where)
    if not isinstance(study, dict):
        return
    yield from _strings(study, study_fields, where)
    yield from _optional(study, {k: v for k, v in _OPTIONAL_STUDY.items() if k not in study_fields}, where)
    if "instruction_answer_pairs" not in study:
        yield f"{where} has no 'instruction_answer_pairs'"
        return
    pairs = study["instruction_answer_pairs"]
    if not isinstance(pairs, dict):
        yield f"{where}: instruction_answer_pairs must be a JSON object, got {type(pairs).__name__}"
        return
    for polarity in ("positive", "negative"):
        group = pairs.get(f"{polarity}_pairs", [])
        if not isinstance(group, list):
            yield f"{where}: {polarity}_pairs must be a list, got {type(group).__name__}"
            continue
        for i, pair in enumerate(group):
            yield from _pair_problems(pair, polarity == "positive", targets, f"{where} {polarity} pair {i}")


def structure_problems(data: Any, study_fields: Sequence[str] = ("image_path",),
                       targets: Collection[str] | None = None) -> list[str]:
    """What keeps the readers of this package from using ``data`` as a dataset: not a ``{split: {study_key:
    study}}`` object of the three splits, a study without its string ``study_fields`` or its pair lists, a pair
    without its string fields (positive pairs: ``seg_mask_path`` too), or a field readers use when present with
    another type (``dicom_id``, ``subject_id``, ``section_name``, ``section_content``: strings; ``seg``: true or
    false; ``sent_idx``: a string; ``reported_location``, ``grounded_location``, ``location``: lists of strings).
    ``targets``: the pair targets a reader knows (e.g. the 7 lesions); None accepts any string. Lighter than
    :func:`validate_dataset` (no vocabulary besides ``targets``, no id rules); empty when usable."""
    if not isinstance(data, dict):
        return [f"the dataset must be a JSON object {{split: {{study_key: study}}}}, got {type(data).__name__}"]
    problems: list[str] = []
    for split, studies in data.items():
        if split not in SPLITS:
            problems.append(f"unknown split {split!r} (expected {', '.join(SPLITS)})")
        elif not isinstance(studies, dict):
            problems.append(f"split {split} must be a JSON object of studies, got {type(studies).__name__}")
        else:
            for key, study in studies.items():
                problems.extend(_study_problems(study, study_fields, targets, f"{split}.{key}"))
    return problems


def load_dataset_file(path: str | Path) -> DatasetFile:
    """A MIMIC-ILS JSON file, or the one in a dataset folder, as a typed :class:`DatasetFile` (splits of
    :class:`Study` records with their :class:`PositivePair` / :class:`NegativePair`); a file that does not fit the
    schema is an :class:`InputError` naming it and the first problems."""
    data = load_dataset(path)
    try:
        return DatasetFile.model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:_SHOWN]]
        more = f" (and {exc.error_count() - _SHOWN} more)" if exc.error_count() > _SHOWN else ""
        raise InputError(f"not a MIMIC-ILS dataset: {'; '.join(problems)}{more}", _dataset_json(path)) from None


def read_dataset(path: str | Path, study_fields: Sequence[str] = ("image_path",),
                 targets: Collection[str] | None = None, splits: Collection[str] | None = None) -> dict[str, Any]:
    """:func:`load_dataset`, then :func:`structure_problems`: a file readers cannot use is an
    :class:`InputError` naming it and its first problems. ``splits``: read only these splits, as a stream
    (:func:`iter_dataset`; memory holds only their studies, and only their studies are checked); a split the file
    does not have is absent from the result. None: the whole file."""
    if splits is None:
        data = load_dataset(path)
        problems = structure_problems(data, study_fields, targets)
        if problems:
            raise _unusable(problems, path)
        return data
    wanted = list(dict.fromkeys(splits))
    data = {split: {} for split in wanted}
    for split, key, study in iter_dataset(path, study_fields, targets, wanted):
        data[split][key] = study
    empty = [split for split in wanted if not data[split]]
    if empty:
        kinds = _checked_kinds(path)
        for split in empty:
            if split not in kinds:
                del data[split]
            elif kinds[split] != "object":
                raise InputError(f"not a usable MIMIC-ILS dataset: split {split} must be a JSON object of studies, "
                                 f"got {kinds[split]}", _dataset_json(path))
    return data


def iter_dataset(path: str | Path, study_fields: Sequence[str] = ("image_path",),
                 targets: Collection[str] | None = None,
                 splits: Iterable[str] = SPLITS) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(split, study key, study)`` of a MIMIC-ILS JSON file, or the one in a dataset folder, split by split in
    ``splits`` order and in file order within a split, read as a stream: memory holds one study at a time. A study
    readers cannot use (:func:`structure_problems`) is an :class:`InputError` naming the file and its problems,
    raised when the stream reaches it; so is a study key that appears twice in a split, a file that is not a JSON
    object, not valid JSON or nested deeper than :data:`MAX_OPEN`. A split the file does not have, or that is not a
    JSON object, yields nothing; other top-level names are not read (:func:`check_splits` finds them)."""
    json_path = _readable_json(path)
    try:
        with json_path.open("rb") as stream:
            _check_object_start(stream, json_path)
            for split in splits:
                stream.seek(0)
                seen: set[str] = set()
                for key, study in ijson.kvitems(_DepthGuard(stream, json_path), split, use_float=True):
                    if key in seen:
                        raise InputError(f"not a usable MIMIC-ILS dataset: study {split}.{key} appears twice",
                                         json_path)
                    seen.add(key)
                    problems = list(_study_problems(study, study_fields, targets, f"{split}.{key}"))
                    if problems:
                        raise _unusable(problems, json_path)
                    yield split, key, study
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        raise _json_error(exc, json_path) from exc
    except OSError as exc:
        raise InputError(f"cannot read the dataset JSON ({exc.strerror or exc})", json_path) from exc


def _unusable(problems: Sequence[str], path: str | Path) -> InputError:
    """The :class:`InputError` of a file readers cannot use: its first :data:`_SHOWN` problems and how many more."""
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return InputError(f"not a usable MIMIC-ILS dataset: {'; '.join(problems[:_SHOWN])}{more}", path)


def _json_error(exc: Exception, path: Path) -> InputError:
    """The :class:`InputError` of a stream that is not valid JSON: the parser's message, its first line only."""
    message = exc.args[0] if exc.args and isinstance(exc, ijson.JSONError) else str(exc)
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    first_line = (str(message).strip().splitlines() or [type(exc).__name__])[0]
    return InputError(f"not valid JSON ({first_line})", path)


def check_splits(path: str | Path) -> None:
    """An :class:`InputError` naming the dataset JSON of ``path`` when its top level holds a name other than the
    three splits, or a split that is not a JSON object (read as a stream, as :func:`iter_dataset` skips both)."""
    kinds = _checked_kinds(path)
    problems = [f"unknown split {name!r} (expected {', '.join(SPLITS)})" for name in kinds if name not in SPLITS]
    problems += [f"split {name} must be a JSON object of studies, got {kind}" for name, kind in kinds.items()
                 if name in SPLITS and kind != "object"]
    if problems:
        raise _unusable(problems, _dataset_json(path))


def dataset_splits(path: str | Path) -> list[str]:
    """The top-level names (splits) of a MIMIC-ILS JSON file, or the one in a dataset folder, in file order, read as
    a stream."""
    return list(_checked_kinds(path))


def _checked_kinds(path: str | Path) -> dict[str, str]:
    """:func:`_top_level_kinds` of the dataset JSON of ``path``; a file that is empty, not a JSON object or not
    valid JSON is an :class:`InputError`."""
    json_path = _readable_json(path)
    try:
        with json_path.open("rb") as stream:
            _check_object_start(stream, json_path)
        return _top_level_kinds(json_path)
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        raise _json_error(exc, json_path) from exc
    except OSError as exc:
        raise InputError(f"cannot read the dataset JSON ({exc.strerror or exc})", json_path) from exc


#: The most brackets and braces a streamed dataset file may hold open at once (a MIMIC-ILS file nests 7 deep). The
#: streaming parser's memory grows with the square of the depth (a 200 KB file nested 100,000 deep takes gigabytes),
#: so a file open deeper is refused as it is read. Brackets inside strings are counted too (cheap, and a dataset's
#: strings hold few unbalanced ones), hence the margin.
MAX_OPEN: Final[int] = 4096
_BRACKET_STEP: Final[np.ndarray] = np.zeros(256, np.int8)
_BRACKET_STEP[[ord("{"), ord("[")]] = 1
_BRACKET_STEP[[ord("}"), ord("]")]] = -1


class _DepthGuard:
    """A binary file read through, refusing (:class:`InputError`) JSON that holds more than :data:`MAX_OPEN`
    brackets and braces open, chunk by chunk, before the parser sees the chunk."""

    def __init__(self, stream: Any, path: Path) -> None:
        self._stream, self._path = stream, path
        self._open = 0

    def read(self, size: int = -1) -> bytes:
        """The next ``size`` bytes, checked."""
        chunk = self._stream.read(size)
        if chunk:
            levels = np.cumsum(_BRACKET_STEP[np.frombuffer(chunk, np.uint8)], dtype=np.int32) + self._open
            if int(levels.max()) > MAX_OPEN:
                raise InputError(f"not a usable MIMIC-ILS dataset: JSON nested too deeply (more than {MAX_OPEN} "
                                 "brackets open)", self._path)
            self._open = max(0, int(levels[-1]))
        return chunk


def _check_object_start(stream: Any, path: Path) -> None:
    """An :class:`InputError` unless the binary ``stream`` starts (after white space) with a JSON object."""
    head = stream.read(4096)
    if head.startswith(b"\xef\xbb\xbf"):
        raise InputError("not valid JSON (it starts with a UTF-8 byte-order mark; save it without one)", path)
    head = head.lstrip(b" \t\r\n")
    while not head:
        chunk = stream.read(4096)
        if not chunk:
            raise InputError("the dataset JSON file is empty", path)
        head = chunk.lstrip(b" \t\r\n")
    if not head.startswith(b"{"):
        raise InputError("not a usable MIMIC-ILS dataset: the dataset must be a JSON object {split: {study_key: "
                         "study}}", path)


def _top_level_kinds(path: Path) -> dict[str, str]:
    """The JSON kind (``object``, ``array``, ``string``, ...) of each top-level member of the JSON object in
    ``path``, read as a stream."""
    kinds: dict[str, str] = {}
    names = {"start_map": "object", "start_array": "array", "integer": "number", "double": "number"}
    key: str | None = None
    with path.open("rb") as stream:
        for prefix, event, value in ijson.parse(_DepthGuard(stream, path), use_float=True):
            if prefix == "" and event == "map_key":
                key = value
            elif key is not None and prefix == key and key not in kinds:
                kinds[key] = names.get(event, event)
    return kinds
