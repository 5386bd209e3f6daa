"""Model clients of the CheXpercept harness and their registry.

A client answers one request (OpenAI-format messages) with a :class:`Completion`. ``SPEC`` strings:
``openai:MODEL`` (:mod:`.openai`), ``hf:MODEL_DIR`` (:mod:`.hf`, transformers imported lazily),
``ils:CHECKPOINT`` (:mod:`.ils_agent`: an ILS model answering from its own mask and the geometry) and the
built-in baselines ``random``, ``first-option``, ``always-yes``, ``oracle`` (:mod:`.baselines`).

Baselines get the question (options and GT) through the ``question`` side channel of
:meth:`Client.complete`; it is never part of the messages (:meth:`Client.cache_context` puts what they read
of it in the cache key). Every client goes through the runner's response cache, keyed by its ``identity``.
Errors (:mod:`cxrground.llm`): :class:`TransientError` (retried by the runner, optionally with a
server-given ``retry_after``) and :class:`PermanentError` (the case fails).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from cxrground.errors import ConfigError
from cxrground.llm import ClientError, Completion, PermanentError, TransientError

if TYPE_CHECKING:
    from cxrground.evaluation.percept.conversation import Question

__all__ = ["CLIENTS", "Client", "ClientError", "Completion", "PermanentError", "TransientError", "make_client"]


class Client(Protocol):
    """What the runner needs from a model client."""

    kind: str
    model: str
    decoding: dict[str, Any]
    max_images: int

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two clients answer alike (the model part of the cache key)."""
        ...

    def cache_context(self, question: Question, case_id: str) -> dict[str, Any] | None:
        """Inputs outside the messages that shape the answer (None for model clients)."""
        ...

    async def complete(self, messages: Sequence[dict[str, Any]], question: Question, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """Answer the last user message of ``messages`` (``question``/``case_id``: side channel for baselines).

        ``seed`` is the sample's seed: sent with the request (or used locally) when sampling.
        """
        ...

    async def aclose(self) -> None:
        """Release connections / models."""
        ...


def _openai(name: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.openai import OpenAIClient

    return OpenAIClient(name, **opts)


def _hf(name: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.hf import HFClient

    return HFClient(name, **opts)


def _ils(name: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.ils_agent import IlsAgentClient

    return IlsAgentClient(name)


def _baseline(kind: str) -> Callable[..., Client]:
    def make(name: str, **opts: Any) -> Client:
        from cxrground.evaluation.percept.clients.baselines import BaselineClient

        return BaselineClient(kind, seed=int(opts.get("seed", 0)))

    return make


#: ``prefix`` -> factory(name, **options). Prefixed specs are ``prefix:NAME``; baselines have no name.
CLIENTS: Final[dict[str, Callable[..., Client]]] = {
    "openai": _openai,
    "hf": _hf,
    "ils": _ils,
    "random": _baseline("random"),
    "first-option": _baseline("first-option"),
    "always-yes": _baseline("always-yes"),
    "oracle": _baseline("oracle"),
}
_NEEDS_NAME: Final[frozenset[str]] = frozenset({"openai", "hf", "ils"})


def make_client(spec: str, **opts: Any) -> Client:
    """Build the client of ``spec``; options a client does not use are ignored."""
    prefix, _, name = spec.partition(":")
    if prefix not in CLIENTS:
        raise ConfigError(f"unknown model spec {spec!r}; use one of openai:MODEL, hf:MODEL_DIR, ils:CHECKPOINT, "
                          + ", ".join(k for k in CLIENTS if k not in _NEEDS_NAME))
    if prefix in _NEEDS_NAME and not name:
        raise ConfigError(f"model spec {spec!r} needs a name after '{prefix}:'")
    if prefix not in _NEEDS_NAME and name:
        raise ConfigError(f"baseline {prefix!r} takes no name")
    return CLIENTS[prefix](name, **opts)
