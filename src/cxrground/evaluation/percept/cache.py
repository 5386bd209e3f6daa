"""SQLite response cache of the CheXpercept harness (one file, WAL, safe for concurrent writers).

Built on :class:`cxrground.reports.structure.cache.ResponseCache`. The key is the SHA-256 of the canonical
JSON of client kind + model, decoding settings and the exact message list, images included
(:func:`percept_cache_key`). The stored request record replaces every image data URL by its SHA-256 so that
the file stays small; the stored value is the JSON ``{content, usage, model_version}`` of the response.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cxrground.reports.structure.cache import ResponseCache, cache_key

__all__ = ["PerceptCache", "percept_cache_key", "redact_images"]


def percept_cache_key(kind: str, model: str, decoding: Mapping[str, Any],
                      messages: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 (hex) of client kind, model, decoding settings and the exact messages."""
    return cache_key(f"{kind}:{model}", decoding, messages)


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
        self.store = ResponseCache(path)
        self.path = self.store.path

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached response record, or None."""
        text = self.store.get(key)
        return None if text is None else json.loads(text)

    def put(self, key: str, kind: str, model: str, decoding: Mapping[str, Any],
            messages: Sequence[Mapping[str, Any]], record: Mapping[str, Any]) -> None:
        """Store the response ``record`` for ``key``."""
        request = {"kind": kind, "model": model, "decoding": dict(decoding), "messages": redact_images(messages)}
        self.store.put(key, f"{kind}:{model}", request, json.dumps(dict(record), sort_keys=True))

    def __len__(self) -> int:
        return len(self.store)

    def close(self) -> None:
        """Close the database."""
        self.store.close()
