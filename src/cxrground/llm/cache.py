"""SQLite cache of chat-completion responses, keyed for sampled decoding as well as greedy decoding.

:func:`cache_key` is the SHA-256 of the canonical JSON (sorted keys, no spaces) of
``{"model": identity, "decoding": params, "sample": k, "messages": [...]}`` (+ ``"context"`` when given):

- ``identity``: what makes two models answer alike. Remote servers: ``{"kind": "openai", "model", "base_url"}``;
  local folders: ``{"kind": "hf", "fingerprint"}`` (:func:`cxrground.llm.fingerprint.model_fingerprint`, not
  the path); built-in baselines: ``{"kind", "seed"}``.
- ``params``: the decoding settings sent (temperature, max_tokens, top_p, ...), with the request's ``seed``
  when sampling (temperature > 0), so another seed is another key.
- ``k``: the sample index (repeat). It is in the key at every temperature: repeat ``k`` is always ``k``, a
  second repeat never reuses the first one's answer, and a rerun reuses both.
- ``context``: inputs that are not in the messages but shape the answer (the baselines' side channel).

Only responses that parsed and validated are stored (a malformed answer is asked again next time; a caller that
finds a stored row it cannot read treats it as a miss and stores the new answer over it). The file is created on
first use; a file that is not a SQLite database, is damaged, or holds a ``responses`` table of another layout is a
:class:`CacheError` naming it, raised when the cache is opened (before any request) or, for damage found later,
on the read or write that meets it; ``":memory:"`` (the default) keeps the cache for the life of the object. Several
processes may share one file (WAL mode; a writer waits up to 60 s for the lock).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cxrground.errors import BatchStopped

__all__ = ["CacheError", "ResponseCache", "cache_key"]

#: The columns of the ``responses`` table.
_COLUMNS = ("key", "model", "request", "response", "created")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(
    model: str | Mapping[str, Any],
    decoding: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    *,
    sample: int = 0,
    context: Mapping[str, Any] | None = None,
) -> str:
    """SHA-256 (hex) of the canonical JSON of model identity, decoding settings, sample index and messages."""
    payload: dict[str, Any] = {
        "model": model if isinstance(model, str) else dict(model),
        "decoding": dict(decoding),
        "sample": int(sample),
        "messages": [dict(m) for m in messages],
    }
    if context is not None:
        payload["context"] = dict(context)
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CacheError(BatchStopped):
    """The cache file cannot be used: not a SQLite database, damaged, or a ``responses`` table of another layout.
    A :class:`~cxrground.errors.BatchStopped` (every request of a batch would meet it); the message names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"--cache {path}: not a readable SQLite response cache ({problem}); give another file, or "
                         "move this one away to start a new cache")


class ResponseCache:
    """A key -> response-text store in one SQLite file (thread-safe; one connection guarded by a lock)."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60.0)
        except sqlite3.Error as exc:
            raise CacheError(self.path, str(exc)) from None
        try:
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(_SCHEMA)
            columns = tuple(row[1] for row in self._conn.execute("PRAGMA table_info(responses)"))
            missing = [c for c in _COLUMNS if c not in columns]
            if missing:
                raise CacheError(self.path, f"its 'responses' table has the columns {', '.join(columns)}, without "
                                            f"{', '.join(missing)}")
            self._conn.execute("SELECT key, response FROM responses LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            self._conn.close()
            raise CacheError(self.path, str(exc)) from None
        except CacheError:
            self._conn.close()
            raise

    def get(self, key: str) -> str | None:
        """The cached response text for ``key``, or None."""
        try:
            with self._lock:
                row = self._conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise CacheError(self.path, str(exc)) from None
        return None if row is None else str(row[0])

    def put(self, key: str, model: str, request: Mapping[str, Any], response: str) -> None:
        """Store ``response`` under ``key`` (replacing an older entry); ``model`` and ``request`` are for reading."""
        blob = json.dumps(dict(request), sort_keys=True, ensure_ascii=False)
        try:
            with self._lock:
                self._conn.execute(
                    "INSERT OR REPLACE INTO responses (key, model, request, response, created) VALUES (?, ?, ?, ?, ?)",
                    (key, model, blob, response, time.time()),
                )
        except sqlite3.Error as exc:
            raise CacheError(self.path, str(exc)) from None

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
