"""The request/response types every CheXpercept model client shares: :class:`Client`, :class:`Completion`
and the errors (:class:`TransientError` is retried by the runner, :class:`PermanentError` fails the case).

Imported by the client modules and re-exported by :mod:`cxrground.evaluation.percept.clients`, whose
registry builds the clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cxrground.errors import CXRGroundError

if TYPE_CHECKING:
    from cxrground.evaluation.percept.conversation import Question

__all__ = ["Client", "ClientError", "Completion", "PermanentError", "TransientError"]


class ClientError(CXRGroundError):
    """A request failed; ``reason`` says why."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        self.reason = reason
        self.retry_after = retry_after
        super().__init__(reason)


class TransientError(ClientError):
    """429, 5xx, timeout or connection error: worth retrying."""


class PermanentError(ClientError):
    """Any other failure (4xx, malformed response): not retried."""


@dataclass(frozen=True)
class Completion:
    """One response: the assistant text (None when the server sent none), token usage and model version."""

    content: str | None
    usage: dict[str, int] = field(default_factory=dict)
    model_version: str | None = None


class Client(Protocol):
    """What the runner needs from a model client."""

    kind: str
    model: str
    decoding: dict[str, Any]
    max_images: int
    cacheable: bool

    async def complete(self, messages: Sequence[dict[str, Any]], question: Question, case_id: str = "") -> Completion:
        """Answer the last user message of ``messages`` (``question``/``case_id``: side channel for baselines)."""
        ...

    async def aclose(self) -> None:
        """Release connections / models."""
        ...
