"""Which backend runs each model-dependent stage of an ILS build (:class:`BackendSpec`).

Shared by the build engine (:mod:`cxrground.ils.build`), which hashes it to guard resumption, and the
per-study pipeline (:mod:`cxrground.ils.pipeline`), which builds the backends from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from cxrground.io.files import sha256_json

__all__ = ["LLM_FETCH_OPTIONS", "BackendSpec"]

#: Options of the ``llm`` structurer that say how its answers are fetched (where the server and the response cache
#: are, how many requests at once, the variable holding the key, timeouts and retries), not what they are: a build
#: resumes across a change of these (the model, prompts and decoding settings count).
LLM_FETCH_OPTIONS: Final[frozenset[str]] = frozenset({
    "base_url", "api_key_env", "timeout", "max_retries", "backoff", "max_backoff", "max_retry_after", "concurrency",
    "cache", "cache_endpoint"})


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

    def resume_hash(self) -> str:
        """:meth:`spec_hash` without the ``llm`` structurer's fetch options (:data:`LLM_FETCH_OPTIONS`): what a
        build must share with the one in its folder to resume it."""
        if self.structurer != "llm":
            return self.spec_hash()
        kwargs = {k: v for k, v in self.structurer_kwargs.items() if k not in LLM_FETCH_OPTIONS}
        return replace(self, structurer_kwargs=kwargs).spec_hash()
