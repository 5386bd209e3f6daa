"""Model clients of the CheXpercept harness and their registry.

A client answers one request (OpenAI-format messages) with a :class:`Completion`. ``SPEC`` strings:
``openai:MODEL`` (:mod:`.openai`), ``hf:MODEL_DIR`` (:mod:`.hf`, transformers imported lazily) and the
built-in baselines ``random``, ``first-option``, ``always-yes``, ``oracle`` (:mod:`.baselines`).

Baselines get the question (options and GT) through the ``question`` side channel of
:meth:`Client.complete`; it is never part of the messages. Errors: :class:`TransientError` (retried by
the runner, optionally with a server-given ``retry_after``) and :class:`PermanentError` (the case fails).
These shared types live in :mod:`.base` (which the client modules import) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.base import (
    Client,
    ClientError,
    Completion,
    PermanentError,
    TransientError,
)

__all__ = ["CLIENTS", "Client", "ClientError", "Completion", "PermanentError", "TransientError", "make_client"]


def _openai(name: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.openai import OpenAIClient

    return OpenAIClient(name, **opts)


def _hf(name: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.hf import HFClient

    return HFClient(name, **opts)


def _baseline(kind: str) -> Callable[..., Client]:
    def make(name: str, **opts: Any) -> Client:
        from cxrground.evaluation.percept.clients.baselines import BaselineClient

        return BaselineClient(kind, seed=int(opts.get("seed", 0)))

    return make


#: ``prefix`` -> factory(name, **options). Prefixed specs are ``prefix:NAME``; baselines have no name.
CLIENTS: Final[dict[str, Callable[..., Client]]] = {
    "openai": _openai,
    "hf": _hf,
    "random": _baseline("random"),
    "first-option": _baseline("first-option"),
    "always-yes": _baseline("always-yes"),
    "oracle": _baseline("oracle"),
}
_NEEDS_NAME: Final[frozenset[str]] = frozenset({"openai", "hf"})


def make_client(spec: str, **opts: Any) -> Client:
    """Build the client of ``spec``; options a client does not use are ignored."""
    prefix, _, name = spec.partition(":")
    if prefix not in CLIENTS:
        raise ConfigError(f"unknown model spec {spec!r}; use one of openai:MODEL, hf:MODEL_DIR, "
                          + ", ".join(k for k in CLIENTS if k not in _NEEDS_NAME))
    if prefix in _NEEDS_NAME and not name:
        raise ConfigError(f"model spec {spec!r} needs a name after '{prefix}:'")
    if prefix not in _NEEDS_NAME and name:
        raise ConfigError(f"baseline {prefix!r} takes no name")
    return CLIENTS[prefix](name, **opts)
