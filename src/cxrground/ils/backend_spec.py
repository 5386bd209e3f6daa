"""Which backend runs each model-dependent stage of an ILS build (:class:`BackendSpec`).

Shared by the build engine (:mod:`cxrground.ils.build`), which hashes it to guard resumption, and the
per-study pipeline (:mod:`cxrground.ils.pipeline`), which builds the backends from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cxrground.io.files import sha256_json

__all__ = ["BackendSpec"]


@dataclass(frozen=True)
class BackendSpec:
    """Which backend runs each model-dependent stage, with its keyword arguments (JSON-serialisable)."""

    structurer: str = "rules"
    structurer_kwargs: dict[str, Any] = field(default_factory=dict)
    segmenter: str = "unet"
    segmenter_kwargs: dict[str, Any] = field(default_factory=dict)
    synthesizer: str = "normative"
    synthesizer_kwargs: dict[str, Any] = field(default_factory=dict)
    detector: str = "anomaly"
    detector_kwargs: dict[str, Any] = field(default_factory=dict)
    qc_segmenter: str | None = None
    """Second lung/heart segmenter for the ILS §6 cross-check (None = no cross-check)."""
    qc_segmenter_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def spec_hash(self) -> str:
        """Short hash of the backend choice."""
        return sha256_json(self.to_dict(), default=str)[:12]
