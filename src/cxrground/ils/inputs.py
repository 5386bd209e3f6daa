"""What each unit of an ILS build was made from: the input fingerprints that let a resumed build process again a
study whose report or image changed (``OUT/unit_inputs.jsonl``), and the input set a cohort-fitted normative model
was fitted on (``normative_fitted.inputs.jsonl``)."""

from __future__ import annotations

import json
import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cxrground.ils.cohort_normative import FITTED_FILE
from cxrground.ils.tasks import StudyTask, in_key_order, input_fingerprint
from cxrground.ils.units import READ_AHEAD, done_check, read_unit, unit_store
from cxrground.io.files import atomic_path, atomic_write_bytes
from cxrground.io.progress import progress_bar

#: The build's index of what each unit was made from, beside the units (in the local stage when the output is on
#: object storage, uploaded with the other state files).
INPUTS_INDEX = "unit_inputs.jsonl"
#: The input set a cohort-fitted normative model was fitted on (``FITTED_FILE``'s companion).
FITTED_INPUTS = str(Path(FITTED_FILE).with_suffix(".inputs.jsonl"))
#: Fingerprints computed ahead of their use, by this many threads (a stat and a report read each; on object
#: storage two requests).
FINGERPRINT_THREADS = 16
UNKNOWN = object()  # no index entry: the unit itself says


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """``(item, fn(item))`` in the order of ``items``, :data:`READ_AHEAD` computed ahead by
    :data:`FINGERPRINT_THREADS` threads."""
    with ThreadPoolExecutor(FINGERPRINT_THREADS) as pool:
        window: deque[tuple[Any, Future]] = deque()
        for item in items:
            window.append((item, pool.submit(fn, item)))
            if len(window) >= READ_AHEAD:
                first, fut = window.popleft()
                yield first, fut.result()
        while window:
            first, fut = window.popleft()
            yield first, fut.result()


class InputIndex:
    """``OUT/unit_inputs.jsonl``: which inputs each study's unit was made from, so that a resume compares the inputs
    without reading every unit. Append-only, written by the driver only, one JSON object per line:

    - ``{"inputs": FP, "study": KEY}``: the unit of ``KEY`` is made from the inputs of fingerprint ``FP``. Written
      when the study is handed to a worker, before its unit can exist, and when a resume had to read the unit
      to learn it; ``null``: the unit predates input fingerprints.
    - ``{"changed": true, "study": KEY}``: the unit of ``KEY`` was found made from other inputs; written before the
      stale unit is removed. It is what the card's count of studies processed again for changed inputs reads.

    A study's last ``inputs`` line wins. Only whole lines count: a line torn by a kill (no newline) is ignored and
    ended before the next append. A study without an entry (lost with a torn line, a run killed before the index
    was uploaded, units from another run) is looked up in its unit, which records the same fingerprint. The file
    grows by a line per study handed to a worker (about 50 bytes; 12 MB for the 227,835 MIMIC-CXR studies) and is
    read whole at each resume (a dict of study keys, a few tens of MB at MIMIC size).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inputs: dict[str, str | None] = {}
        self.changed: set[str] = set()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.split(b"\n")[:-1]:  # the part after the last newline is empty or torn
            try:
                record = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            self._take(record)

    def _take(self, record: Any) -> None:
        if not isinstance(record, dict) or not isinstance(record.get("study"), str):
            return
        key = record["study"]
        if record.get("changed") is True:
            self.changed.add(key)
            self.inputs.pop(key, None)
        elif "inputs" in record and (record["inputs"] is None or isinstance(record["inputs"], str)):
            self.inputs[key] = record["inputs"]

    def recorded(self, key: str) -> Any:
        """The fingerprint the unit of ``key`` was made from, None when it predates them, :data:`UNKNOWN` when the
        index has no entry."""
        return self.inputs.get(key, UNKNOWN)

    @contextmanager
    def appending(self) -> Iterator[Callable[[dict[str, Any]], None]]:
        """A function that appends one record as a whole line, written through at once (a torn last line left by
        a kill is ended first, so that it stays one line that does not count)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as fh:
            if fh.tell():
                with self.path.open("rb") as tail:
                    tail.seek(-1, os.SEEK_END)
                    if tail.read(1) != b"\n":
                        fh.write(b"\n")

            def add(record: dict[str, Any]) -> None:
                fh.write(json.dumps(record, sort_keys=True).encode("utf-8") + b"\n")
                fh.flush()
                self._take(record)

            yield add

    def compact(self) -> None:
        """Rewrite the file (atomically) without the lines that repeat the study's previous line (a study handed to
        a worker again after a kill) and without torn lines, so that a resumed build leaves the file an
        uninterrupted one writes; what it records is unchanged."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        kept: list[bytes] = []
        last: dict[str, Any] = {}
        for line in data.split(b"\n")[:-1]:
            try:
                record = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            key = record.get("study") if isinstance(record, dict) else None
            if isinstance(key, str) and last.get(key) == record:
                continue
            if isinstance(key, str):
                last[key] = record
            kept.append(line + b"\n")
        if len(kept) != data.count(b"\n") or not data.endswith(b"\n"):
            atomic_write_bytes(self.path, b"".join(kept))

    def noting(self, todo: Iterable[StudyTask]) -> Iterator[StudyTask]:
        """``todo``, each task's fingerprint appended to the index before the task is handed on (to a worker)."""
        with self.appending() as add:
            for task, inputs in ordered_map(input_fingerprint, todo):
                add({"inputs": inputs, "study": task.study_key})
                yield task


@dataclass
class InputSurvey:
    """What a resume found, comparing each study's inputs with those its unit (and the fitted model) was made from."""

    changed: list[str] = field(default_factory=list)
    """Studies whose unit was made from other inputs (to be processed again)."""
    predating: list[str] = field(default_factory=list)
    """Studies whose unit records no inputs (written before units did)."""
    learned: list[dict[str, Any]] = field(default_factory=list)
    """Index entries read from units that had none."""
    fitted: Counter | None = None
    """``added``, ``removed``, ``changed`` studies against the input set of the fitted model (None: not compared)."""
    fitted_gone: list[str] = field(default_factory=list)
    """The studies of the fitted model's input set that changed or were removed since."""


def survey_inputs(tasks: Iterable[StudyTask], dest: str | Path, index: InputIndex, fitted_inputs: Path | None,
                  progress: bool = False) -> InputSurvey:
    """Compare the current inputs of ``tasks`` with what their units were made from (the index, else the unit) and,
    given ``fitted_inputs``, with the input set a fitted model was made from.

    One pass in study order: a fingerprint for each study that has a unit (all of them with ``fitted_inputs``),
    computed ahead by threads; a unit is read only when the index has no entry for it. ``progress``: a bar over
    the studies.
    """
    done = done_check(dest)
    store = unit_store(str(dest))
    survey = InputSurvey(fitted=Counter(added=0, removed=0, changed=0) if fitted_inputs is not None else None)

    def look(task: StudyTask) -> tuple[bool, str | None, Any, bool]:
        has = done(task.study_key)
        if not has and fitted_inputs is None:
            return False, None, UNKNOWN, False
        inputs = input_fingerprint(task)
        recorded = index.recorded(task.study_key) if has else UNKNOWN
        if not has or recorded is not UNKNOWN:
            return has, inputs, recorded, False
        text = read_unit(store, task.study_key)
        if text is None:  # removed since the listing
            return False, inputs, UNKNOWN, False
        try:
            recorded = json.loads(text).get("inputs")
        except (json.JSONDecodeError, AttributeError):
            return True, inputs, "", False  # a damaged unit: redo it
        return True, inputs, recorded, True

    fitted = fingerprint_lines(fitted_inputs) if fitted_inputs is not None else iter(())
    then = next(fitted, None)
    looked = ordered_map(look, in_key_order(tasks))
    for task, (has, inputs, recorded, learned) in progress_bar(looked, desc="compare inputs", unit="study",
                                                               progress=progress,
                                                               total=len(tasks) if isinstance(tasks, Sized) else None):
        key = task.study_key
        if learned:
            survey.learned.append({"inputs": recorded, "study": key})
        if has and recorded is None:
            survey.predating.append(key)
        elif has and recorded != inputs:
            survey.changed.append(key)
        if survey.fitted is None:
            continue
        while then is not None and then[0] < key:
            survey.fitted["removed"] += 1
            survey.fitted_gone.append(then[0])
            then = next(fitted, None)
        if then is not None and then[0] == key:
            if then[1] != inputs:
                survey.fitted["changed"] += 1
                survey.fitted_gone.append(key)
            then = next(fitted, None)
        else:
            survey.fitted["added"] += 1
    if survey.fitted is not None:
        rest = ([then[0]] if then is not None else []) + [k for k, _ in fitted]
        survey.fitted["removed"] += len(rest)
        survey.fitted_gone += rest
    return survey


def fingerprint_lines(path: Path) -> Iterator[tuple[str, str]]:
    """``(study, fingerprint)`` of a file :func:`write_fitted_inputs` wrote, in its (study-key) order."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
                yield record["study"], record["inputs"]
            except (ValueError, KeyError, TypeError):
                continue


def write_fitted_inputs(tasks: Iterable[StudyTask], path: Path) -> None:
    """Write the fingerprint of every study of ``tasks``, in study-key order, to ``path`` (atomically): the input
    set a cohort normative model is about to be fitted on (taken before the fit reads anything, so that an input
    changed during the fit makes the next resume refuse, never pass)."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for task, inputs in ordered_map(input_fingerprint, in_key_order(tasks)):
            fh.write(json.dumps({"inputs": inputs, "study": task.study_key}, sort_keys=True) + "\n")
