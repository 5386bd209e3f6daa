"""A fingerprint of a local model folder (weights, config, tokenizer), cheap enough for 15 GB checkpoints.

:func:`model_fingerprint` is the SHA-256 over every file of the folder (recursively, sorted by relative
path), skipping hidden files and folders (``.cache``, ``.git``) and ``*.md`` (model cards). Per file it hashes
the relative path (``/``-separated) and the size, then the content:

- files up to :data:`WHOLE_LIMIT` (8 MiB: ``config.json``, the tokenizer, the chat template, the generation
  config, small weight files) are hashed whole;
- larger files (weight shards) are sampled: the first MiB (a safetensors file's header with every tensor's
  name, dtype, shape and offsets, and the first tensors), the last MiB, and :data:`PROBES` blocks of 64 KiB
  at evenly spaced offsets in between. About 3 MiB is read per shard whatever its size.

Any change to a small file, to a file's size or to a sampled byte changes the fingerprint; fine-tuning
changes every tensor and hence the sampled blocks. A change confined to bytes outside the samples of a large
file (one edited tensor in the middle of a shard) is not seen. The folder's path is not hashed: a copied or
moved model keeps its fingerprint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

from cxrground.errors import InputError

__all__ = ["PROBES", "WHOLE_LIMIT", "file_digest", "model_fingerprint"]

WHOLE_LIMIT: Final[int] = 8 << 20
EDGE: Final[int] = 1 << 20
PROBES: Final[int] = 16
PROBE_SIZE: Final[int] = 64 << 10


def file_digest(path: Path, size: int) -> bytes:
    """The SHA-256 of one file: whole up to :data:`WHOLE_LIMIT`, else of its sampled blocks (module docstring)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        if size <= WHOLE_LIMIT:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
            return h.digest()
        h.update(fh.read(EDGE))
        span = size - 2 * EDGE - PROBE_SIZE
        for k in range(PROBES):
            fh.seek(EDGE + span * k // max(1, PROBES - 1))
            h.update(fh.read(PROBE_SIZE))
        fh.seek(size - EDGE)
        h.update(fh.read(EDGE))
    return h.digest()


def model_fingerprint(folder: str | Path) -> str:
    """SHA-256 (hex) of the model files in ``folder`` as described in the module docstring."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError("model folder not found", root)
    h = hashlib.sha256()
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    for path in files:
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or path.suffix.lower() == ".md":
            continue
        try:
            size = path.stat().st_size
            digest = file_digest(path, size)
        except OSError as exc:
            raise InputError(f"cannot read model file ({exc.strerror})", path) from None
        h.update(f"{rel.as_posix()}\0{size}\0".encode())
        h.update(digest)
    return h.hexdigest()
