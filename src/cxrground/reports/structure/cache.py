"""SQLite cache of LLM chat-completion responses.

The key is the SHA-256 of the canonical JSON of ``{"model", "decoding", "messages"}`` (:func:`cache_key`):
the same model, decoding settings and exact messages give the same key, so a rerun makes no request.
Only responses that parsed and validated are stored (a malformed answer is asked again next time).
The file is created on first use; ``":memory:"`` (the default) keeps the cache for the life of the object.
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

__all__ = ["ResponseCache", "cache_key"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(model: str, decoding: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 (hex) of the canonical JSON of model, decoding settings and messages."""
    payload = {"model": model, "decoding": dict(decoding), "messages": [dict(m) for m in messages]}
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResponseCache:
    """A key -> response-text store in one SQLite file (thread-safe; one connection guarded by a lock)."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # several processes may share one file (WAL mode; wait up to 60 s for a writer's lock)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60.0)
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(_SCHEMA)

    def get(self, key: str) -> str | None:
        """The cached response text for ``key``, or None."""
        with self._lock:
            row = self._conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, model: str, request: Mapping[str, Any], response: str) -> None:
        """Store ``response`` under ``key`` (replacing an older entry)."""
        blob = json.dumps(dict(request), sort_keys=True, ensure_ascii=False)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO responses (key, model, request, response, created) VALUES (?, ?, ?, ?, ?)",
                (key, model, blob, response, time.time()),
            )

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
