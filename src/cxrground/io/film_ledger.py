"""What films a result was made from: each film's size, modification time and SHA-256, kept beside the result so
that a resumed run finds the films that changed since (and a film copied to another folder is still the same film).

A ledger is an append-only JSON-lines file, one object per line, a later line of the same film winning::

    {"film": "p10/p10000032/s50414267/02aa804e.jpg", "size": 1843275, "mtime_ns": 1733212345123456789,
     "sha256": "9f86d0…"}

``film`` is the film's path relative to the image root the run read (so a moved image folder keeps its ledger).
A last line without its newline (a kill mid-write) is cut off and ignored. ``{"film": ..., "gone": true}`` forgets
a film (it was missing when looked for). A state recorded less than :data:`RACY_NS` after the film's modification
time is marked ``"racy": true``: a rewrite of the same size within the file system's time resolution would keep the
time, so such a film is compared by content until a later record is not racy (as ``git`` treats its index).

:meth:`FilmLedger.compare` tells whether the film a path holds now is the one recorded: equal size and
modification time are taken as the same film without reading it (one ``stat``, as ``git`` and ``make`` do);
otherwise the file is hashed, and equal content is the same film (its new size and time are recorded, so the next
comparison is a ``stat`` again).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from cxrground.errors import ConfigError
from cxrground.io.files import cut_torn_tail, sha256_file

__all__ = ["RACY_NS", "FilmLedger", "FilmState", "Verdict", "film_digest", "racy", "restated"]

#: How a film compares with its record: the same film, another film (changed content), no file there now (or one
#: that cannot be read), or no record of it (a result written before films were recorded).
Verdict = Literal["same", "changed", "missing", "unrecorded"]


#: A state recorded within this many nanoseconds of the film's modification time is racy (see the module).
RACY_NS = 2_000_000_000


def racy(mtime_ns: int) -> bool:
    """Whether a film modified at ``mtime_ns`` could still be rewritten without another modification time."""
    return time.time_ns() - mtime_ns < RACY_NS


@dataclass(frozen=True)
class FilmState:
    """A film file's size in bytes, modification time in nanoseconds and content SHA-256 (hex); ``racy``: recorded
    too soon after the modification for the time to vouch for the content."""

    size: int
    mtime_ns: int
    sha256: str
    racy: bool = False

    @classmethod
    def of(cls, path: str | Path) -> FilmState:
        """The state of the file at ``path`` now (``OSError`` when it cannot be read)."""
        st = os.stat(path)  # before the content: a file rewritten while hashed reads as changed next time
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256_file(path), racy=racy(st.st_mtime_ns))


class FilmLedger:
    """The append-only film ledger at ``path`` (format in the module docstring); missing until a film is recorded."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._states: dict[str, FilmState] = {}
        if self.path.is_file():
            for line in cut_torn_tail(self.path).decode("utf-8", "replace").splitlines():
                state = _parse(line)
                if state is None:
                    continue
                if state[1] is None:
                    self._states.pop(state[0], None)
                else:
                    self._states[state[0]] = state[1]

    def __len__(self) -> int:
        return len(self._states)

    def get(self, film: str) -> FilmState | None:
        """The recorded state of ``film`` (None: not recorded)."""
        return self._states.get(film)

    def record(self, film: str, state: FilmState) -> None:
        """Append ``film``'s state (nothing when it is the recorded one) and flush it to disk."""
        if self._states.get(film) == state:
            return
        record = {"film": film, **asdict(state)}
        if not state.racy:
            record.pop("racy")
        self._append(record)
        self._states[film] = state

    def forget(self, film: str) -> None:
        """Forget ``film`` (a film no longer found): compared again, it is ``unrecorded``."""
        if film in self._states:
            self._append({"film": film, "gone": True})
            del self._states[film]

    def _append(self, record: dict[str, Any]) -> None:
        """Append one line and flush it to disk."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def compare(self, film: str, path: str | Path) -> Verdict:
        """Whether the file at ``path`` holds the film recorded as ``film`` (see the module docstring)."""
        before = self._states.get(film)
        if before is None:
            return "unrecorded"
        try:
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) == (before.size, before.mtime_ns) and not before.racy:
                return "same"
            if st.st_size != before.size:
                return "changed"
            now = FilmState.of(path)
        except OSError:
            return "missing"
        if now.sha256 != before.sha256:
            return "changed"
        self.record(film, now)
        return "same"


def _parse(line: str) -> tuple[str, FilmState | None] | None:
    """A ledger line's film and state (state None: the film is forgotten; None: not a ledger line)."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("film"), str):
            return None
        if obj.get("gone") is True:
            return obj["film"], None
        state = FilmState(size=int(obj["size"]), mtime_ns=int(obj["mtime_ns"]), sha256=str(obj["sha256"]),
                          racy=obj.get("racy") is True)
    except (ValueError, KeyError, TypeError):
        return None
    return obj["film"], state


def film_digest(path: str | Path, recorded: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The SHA-256 of the film at ``path`` and its ``{"size", "mtime_ns"}`` (and ``"racy": true``, see the
    module): the digest a progress record ``recorded`` holds (``sha256``, ``size``, ``mtime_ns``, ``racy``) when the
    film's size and time are the recorded ones and the record is not racy, else read from the file (``OSError`` when
    it cannot be)."""
    st = os.stat(path)
    now: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if racy(st.st_mtime_ns):
        now["racy"] = True
    if (recorded is not None and isinstance(recorded.get("sha256"), str) and recorded.get("racy") is not True
            and (recorded.get("size"), recorded.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)):
        return recorded["sha256"], now
    return sha256_file(path), now


def restated(recorded: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The progress record ``recorded`` with the film state ``state`` of :func:`film_digest` (size, time, racy) in
    place of its own, when they differ (the same film, touched since); None when they do not."""
    now = {**{k: v for k, v in recorded.items() if k not in ("size", "mtime_ns", "racy")}, **state}
    return now if now != dict(recorded) else None


def resume_record(path: str | Path, name: str, recorded: Mapping[str, Any] | None, log: TextIO, *, out: Path,
                  kept: str, retry_failed: bool, verb: str) -> tuple[str, dict[str, Any], Mapping[str, Any] | None]:
    """A folder command's resume decision for one film: its digest and state (:func:`film_digest`; ``OSError`` when
    it cannot be read) and the progress record ``recorded`` to reuse, or None when the film is to be read (no
    record; a recorded failure of a film that changed since, or any recorded failure with ``retry_failed``). A
    touched but unchanged film's record is restated in ``log``. A :class:`~cxrground.errors.ConfigError` when a
    film with a kept result (the record's key ``kept``) changed since the run in ``out`` that ``verb`` it."""
    digest, state = film_digest(path, recorded)
    if recorded is None:
        return digest, state, None
    if recorded.get("sha256") != digest:
        if kept in recorded:
            raise ConfigError(f"film {name} changed since an earlier run in {out} {verb} it; rerun with --overwrite "
                              "to start afresh")
        return digest, state, None  # a failed film that changed since (fixed) is read again
    if (touched := restated(recorded, state)) is not None:  # the same film, touched
        log.write(json.dumps(touched, sort_keys=True) + "\n")
    if kept not in recorded and retry_failed:
        return digest, state, None
    return digest, state, recorded
