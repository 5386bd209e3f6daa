"""Input limits of the HTTP server and the error type that carries an HTTP status.

Every limit is checked before the model runs, and each violation is an :class:`ApiError` with the
status code and a message that names the limit:

* **413** ``payload_too_large`` — the request body or the decoded image is over ``max_upload_bytes``
  (the raw body may be up to :attr:`Limits.max_body_bytes`, which leaves room for base64 and JSON);
  ``too_many_pixels`` — the image header states more than ``max_pixels`` pixels, or more than PIL's own
  decompression-bomb limit (checked before the pixels are decoded, so a bomb is refused cheaply).
* **401** ``invalid_api_key`` — see :mod:`cxrground.serve.access`.
* **415** ``unsupported_media_type`` — the bytes are none of the ``allowed_types`` (sniffed from the
  content, never from a file name or a client's content type).
* **400** ``invalid_request`` — empty or over-long instruction (``max_instruction_chars``), undecodable
  image (the reader's reason is named), remote URLs, file-system paths, a body that is not JSON (or nests too
  deep, or holds an integer too long to convert).
* **408** ``request_timeout`` — the request body did not arrive within ``body_timeout_s`` seconds of its head.
* **503** ``busy`` — ``max_in_flight`` image requests (decode, model, encode) are being worked on in this process
  and no slot came free within ``busy_wait_s`` seconds; or the bodies being received at once would hold more than
  :attr:`Limits.max_bodies_bytes` and no room came free within ``busy_wait_s`` seconds (a request body is held in
  memory until its request is answered, so many large bodies at once would otherwise cost memory without bound; the
  connection is then closed). While a body waits for room, bodies that have stalled (fewer than
  :data:`STALLED_BODY_BYTES` bytes in the last :data:`STALLED_BODY_S` seconds) are dropped to make room, the longest
  stalled first: each gets **408** ``request_timeout`` and its connection is closed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = ["IMAGE_TYPES", "STALLED_BODY_BYTES", "STALLED_BODY_S", "ApiError", "Limits"]

#: Image types the server can read, by sniffed kind.
IMAGE_TYPES: Final[tuple[str, ...]] = ("png", "jpeg", "dicom")
#: A request body still arriving counts as stalled once it has received fewer than :data:`STALLED_BODY_BYTES` bytes
#: in the last :data:`STALLED_BODY_S` seconds (far below the rate a body of the largest size needs to arrive within
#: the body timeout); stalled bodies are dropped when the memory they hold is needed by other requests.
STALLED_BODY_S: Final[float] = 2.0
STALLED_BODY_BYTES: Final[int] = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """What one request may contain (defaults fit full-size chest X-rays, about 3000 × 3000 px) and how many image
    requests one server process works on at once."""

    max_upload_bytes: int = 32 * 1024 * 1024
    max_pixels: int = 40_000_000
    allowed_types: tuple[str, ...] = IMAGE_TYPES
    max_instruction_chars: int = 1000
    max_messages: int = 64
    max_in_flight: int = 2
    busy_wait_s: float = 10.0
    body_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if min(self.max_upload_bytes, self.max_pixels, self.max_instruction_chars, self.max_in_flight) <= 0 \
                or self.busy_wait_s < 0 or not (math.isfinite(self.body_timeout_s) and self.body_timeout_s > 0):
            raise ValueError(f"limits must be positive: {self}")
        unknown = set(self.allowed_types) - set(IMAGE_TYPES)
        if unknown or not self.allowed_types:
            raise ValueError(f"allowed_types must be a non-empty subset of {IMAGE_TYPES}, got {self.allowed_types}")

    @property
    def max_body_bytes(self) -> int:
        """Largest request body read: the image as base64 (4/3 of the bytes) plus 256 KiB for the rest."""
        return (self.max_upload_bytes * 4 + 2) // 3 + 256 * 1024

    @property
    def max_bodies_bytes(self) -> int:
        """Most request-body bytes held at once by the requests of one process: a full body for each request being
        worked on and for two more waiting (about 180 MB with the defaults)."""
        return self.max_body_bytes * (self.max_in_flight + 2)


class ApiError(Exception):
    """A request the server refuses: HTTP ``status``, a machine-readable ``kind`` and a message."""

    def __init__(self, status: int, kind: str, message: str, close: bool = False, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.close = close  # answer with "Connection: close" (a body left unread)
        self.param = param  # the request field at fault, where there is one

    def body(self) -> dict[str, dict[str, str | None]]:
        """The JSON error body (OpenAI-compatible: ``error.message`` / ``error.type`` / ``error.param``)."""
        return {"error": {"type": self.kind, "message": self.message, "code": str(self.status),
                          "param": self.param}}
