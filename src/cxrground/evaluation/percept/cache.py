"""SQLite response cache of the CheXpercept harness (one file, WAL, safe for concurrent writers).

Built on :class:`cxrground.llm.ResponseCache`. The key (:func:`percept_cache_key`) is
:func:`cxrground.llm.cache_key` of the client's identity (``openai``: kind + model + base URL; ``hf``: the
fingerprint of the model folder; baselines: kind + seed), the decoding settings (with the sample's seed when
sampling), the sample index (repeat), the exact message list, images included, and the client's context
(the baselines' case id and question id). The stored request record replaces every image data URL by its
SHA-256 so that the file stays small; the stored value is the JSON ``{content, usage, model_version,
finish_reason}`` (``finish_reason`` absent in rows of earlier versions). A stored value that does not read as such a
record (damaged) is a :class:`ValueError` of :meth:`PerceptCache.get`: the runner counts it as a miss, asks again and
overwrites it; a file that is not a cache is one :class:`~cxrground.errors.InputError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cxrground.errors import InputError
from cxrground.llm import ResponseCache, cache_key

__all__ = ["PerceptCache", "percept_cache_key", "redact_images"]


def percept_cache_key(identity: Mapping[str, Any], decoding: Mapping[str, Any], messages: Sequence[Mapping[str, Any]],
                      sample: int = 0, context: Mapping[str, Any] | None = None) -> str:
    """SHA-256 (hex) of client identity, decoding settings, sample index, the exact messages and the context."""
    return cache_key(identity, decoding, messages, sample=sample, context=context)


def redact_images(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every image data URL replaced by ``sha256:<hex>`` of the URL."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image_url":
                    digest = hashlib.sha256(p["image_url"]["url"].encode()).hexdigest()
                    p = {"type": "image_url", "image_url": {"url": f"sha256:{digest}"}}
                parts.append(p)
            out.append({**m, "content": parts})
        else:
            out.append(dict(m))
    return out


class PerceptCache:
    """Key -> response record (``{"content", "usage", "model_version"}``) in a :class:`ResponseCache`."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        """Open (or create) the cache file ``path``; a file that is not an SQLite database of responses (or that
        cannot be opened) is an :class:`InputError` naming it."""
        try:
            self.store = ResponseCache(path)
        except sqlite3.DatabaseError as exc:  # OperationalError (cannot open) included
            raise InputError(f"cannot be used as the response cache, not an SQLite database of responses ({exc}); "
                             "give another --cache file", path) from None
        self.path = self.store.path

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached response record, or None; a :class:`ValueError` when the stored value is not a response record
        (not JSON, not an object, content not text or null, usage not an object)."""
        text = self.store.get(key)
        if text is None:
            return None
        record = json.loads(text)  # JSONDecodeError is a ValueError
        if (not isinstance(record, dict) or not isinstance(record.get("content"), str | None)
                or not isinstance(record.get("usage") or {}, dict)):
            raise ValueError(f"cache row {key[:12]} is not a response record")
        return record

    def put(self, key: str, identity: Mapping[str, Any], decoding: Mapping[str, Any], sample: int,
            messages: Sequence[Mapping[str, Any]], context: Mapping[str, Any] | None,
            record: Mapping[str, Any]) -> None:
        """Store the response ``record`` for ``key`` (the request is kept for reading, images redacted)."""
        label = ":".join(str(identity.get(k, "")) for k in ("kind", "model") if k in identity) or "?"
        request = {"model": dict(identity), "decoding": dict(decoding), "sample": int(sample),
                   "messages": redact_images(messages), "context": dict(context) if context else None}
        self.store.put(key, label, request, json.dumps(dict(record), sort_keys=True))

    def __len__(self) -> int:
        return len(self.store)

    def close(self) -> None:
        """Close the database."""
        self.store.close()
