"""What films a result was made from: each film's size, modification time and SHA-256, kept beside the result so
that a resumed run finds the films that changed since (and a film copied to another folder is still the same film).

A ledger is an append-only JSON-lines file, one object per line, a later line of the same film winning::

    {"film": "p10/p10000032/s50414267/02aa804e.jpg", "size": 1843275, "mtime_ns": 1733212345123456789,
     "sha256": "9f86d0…"}

``film`` is the film's path relative to the image root the run read (so a moved image folder keeps its ledger).
A last line without its newline (a kill mid-write) is cut off and ignored.

:meth:`FilmLedger.compare` tells whether the film a path holds now is the one recorded: equal size and
modification time are taken as the same film without reading it (one ``stat``, as ``git`` and ``make`` do);
otherwise the file is hashed, and equal content is the same film (its new size and time are recorded, so the next
comparison is a ``stat`` again).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from cxrground.io.files import cut_torn_tail, sha256_file

__all__ = ["FilmLedger", "FilmState", "Verdict", "film_digest"]

#: How a film compares with its record: the same film, another film (changed content), no file there now (or one
#: that cannot be read), or no record of it (a result written before films were recorded).
Verdict = Literal["same", "changed", "missing", "unrecorded"]


@dataclass(frozen=True)
class FilmState:
    """A film file's size in bytes, modification time in nanoseconds and content SHA-256 (hex)."""

    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> FilmState:
        """The state of the file at ``path`` now (``OSError`` when it cannot be read)."""
        st = os.stat(path)  # before the content: a file rewritten while hashed reads as changed next time
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256_file(path))


class FilmLedger:
    """The append-only film ledger at ``path`` (format in the module docstring); missing until a film is recorded."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._states: dict[str, FilmState] = {}
        if self.path.is_file():
            for line in cut_torn_tail(self.path).decode("utf-8", "replace").splitlines():
                state = _parse(line)
                if state is not None:
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"film": film, **asdict(state)}) + "\n")
        self._states[film] = state

    def compare(self, film: str, path: str | Path) -> Verdict:
        """Whether the file at ``path`` holds the film recorded as ``film`` (see the module docstring)."""
        before = self._states.get(film)
        if before is None:
            return "unrecorded"
        try:
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) == (before.size, before.mtime_ns):
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


def _parse(line: str) -> tuple[str, FilmState] | None:
    """A ledger line's film and state (None: not a ledger line)."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("film"), str):
            return None
        state = FilmState(size=int(obj["size"]), mtime_ns=int(obj["mtime_ns"]), sha256=str(obj["sha256"]))
    except (ValueError, KeyError, TypeError):
        return None
    return obj["film"], state


def film_digest(path: str | Path, recorded: Mapping[str, Any] | None) -> tuple[str, dict[str, int]]:
    """The SHA-256 of the film at ``path`` and its ``{"size", "mtime_ns"}``: the digest a progress record
    ``recorded`` holds (``sha256``, ``size``, ``mtime_ns``) when the film's size and time are the recorded ones,
    else read from the file (``OSError`` when it cannot be)."""
    st = os.stat(path)
    now = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if (recorded is not None and isinstance(recorded.get("sha256"), str)
            and (recorded.get("size"), recorded.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)):
        return recorded["sha256"], now
    return sha256_file(path), now
