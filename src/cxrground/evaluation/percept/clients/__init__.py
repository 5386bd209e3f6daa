"""Model clients of the CheXpercept harness and their registry.

A client answers one request (OpenAI-format messages) with a :class:`Completion`. ``SPEC`` strings:
``openai:MODEL`` (:mod:`.openai`), ``hf:MODEL_DIR`` (:mod:`.hf`, transformers imported lazily),
``ils:CHECKPOINT`` (:mod:`.ils_agent`: an ILS model answering from its own mask and the geometry),
``replay:ALL_RESULTS`` (:mod:`.replay`: the responses another evaluator recorded) and the
built-in baselines ``random``, ``first-option``, ``always-yes``, ``oracle`` (:mod:`.baselines`).

Baselines get the question (options and GT) through the ``question`` side channel of
:meth:`Client.complete`; it is never part of the messages (:meth:`Client.cache_context` puts what they read
of it in the cache key). Every client goes through the runner's response cache, keyed by its ``identity``.
Errors (:mod:`cxrground.llm`): :class:`TransientError` (retried by the runner, optionally with a
server-given ``retry_after``) and :class:`PermanentError` (the case fails).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.decoding import SAMPLING_PARAMS, check_sampling_params
from cxrground.extras import check_needs
from cxrground.llm import ClientError, Completion, PermanentError, TransientError
from cxrground.registry import Registry

if TYPE_CHECKING:
    from cxrground.evaluation.percept.conversation import Question

__all__ = ["CLIENTS", "HARNESS_OPTIONS", "SAMPLING_PARAMS", "Client", "ClientError", "Completion", "PermanentError",
           "TransientError", "check_sampling_params", "make_client", "spec_forms"]


class Client(Protocol):
    """What the runner needs from a model client."""

    kind: str
    model: str
    decoding: dict[str, Any]
    max_images: int

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two clients of this kind answer alike (the model part of the cache key; the runner adds
        ``kind`` when it is not named here)."""
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


#: Options the harness passes to every client (:func:`~cxrground.evaluation.percept.runner.run_eval`); each
#: client uses those it needs. Any other option is refused by :data:`CLIENTS`.
HARNESS_OPTIONS: Final[tuple[str, ...]] = ("base_url", "api_key_env", "temperature", "max_tokens", "top_p", "seed",
                                           "max_images", "timeout", "concurrency", "extra_body", "sampling_params")


#: Model clients by spec prefix. Prefixed specs are ``prefix:NAME`` (the name goes to the factory as ``model``);
#: the baselines take no name.
CLIENTS: Final[Registry[Client]] = Registry("model client")


@CLIENTS.register("openai", help="any OpenAI-compatible server (openai:MODEL with --base-url)",
                  options=("model", *HARNESS_OPTIONS, "transport"))
def _openai(model: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.openai import OpenAIClient

    return OpenAIClient(model, **opts)


@CLIENTS.register("hf", help="a local transformers model folder (hf:MODEL_DIR)",
                  options=("model", *HARNESS_OPTIONS, "device"), needs=("torch", "transformers"))
def _hf(model: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.hf import HFClient

    return HFClient(model, **opts)


@CLIENTS.register("ils", help="an ILS model checkpoint answering from its own mask (ils:CHECKPOINT)",
                  options=("model", *HARNESS_OPTIONS), needs=("torch", "safetensors"))
def _ils(model: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.ils_agent import IlsAgentClient

    return IlsAgentClient(model)


@CLIENTS.register("replay", help="the responses another evaluator recorded (replay:ALL_RESULTS, the reference "
                  "evaluator's all_results.json)", options=("model", *HARNESS_OPTIONS))
def _replay(model: str, **opts: Any) -> Client:
    from cxrground.evaluation.percept.clients.replay import ReplayClient

    return ReplayClient(model)


def _baseline(kind: str, help: str) -> None:
    def make(**opts: Any) -> Client:
        from cxrground.evaluation.percept.clients.baselines import BaselineClient

        return BaselineClient(kind, seed=int(opts.get("seed", 0)))

    CLIENTS.register(kind, make, help=help, options=HARNESS_OPTIONS)


_baseline("random", "baseline: a seeded random valid answer")
_baseline("first-option", "baseline: always the first option")
_baseline("always-yes", "baseline: 'Yes' where offered, else the first option")
_baseline("oracle", "baseline: the ground truth (upper bound, checks the scoring)")

#: The placeholder after ``prefix:`` for the clients that need a name.
_NAME_ARG: Final[dict[str, str]] = {"openai": "MODEL", "hf": "MODEL_DIR", "ils": "CHECKPOINT",
                                     "replay": "ALL_RESULTS"}


def _takes_name(prefix: str) -> bool:
    """Whether client ``prefix`` is addressed as ``prefix:NAME`` (it accepts a ``model`` option)."""
    return prefix in _NAME_ARG or "model" in CLIENTS.options(prefix)


def spec_forms() -> str:
    """The accepted ``--model`` forms, e.g. ``openai:MODEL | hf:MODEL_DIR | random | ...`` (CLI help)."""
    return " | ".join(f"{name}:{_NAME_ARG.get(name, 'NAME')}" if _takes_name(name) else name
                      for name in CLIENTS.names())


def make_client(spec: str, **opts: Any) -> Client:
    """Build the client of ``spec`` (``prefix:NAME`` or a baseline name); options are checked by :data:`CLIENTS`, the
    libraries the client needs (``ils:`` and ``hf:``: torch) by :func:`~cxrground.extras.check_needs`."""
    prefix, _, name = spec.partition(":")
    CLIENTS.get(prefix)
    named = _takes_name(prefix)
    if named and not name:
        raise ConfigError(f"model spec {spec!r} needs a name after '{prefix}:'")
    if not named and name:
        raise ConfigError(f"client {prefix!r} takes no name (it accepts no 'model' option): use --model {prefix}")
    check_needs([CLIENTS.need(prefix)], f"--model {spec}")  # before any request is sent
    return CLIENTS.create(prefix, **({"model": name} if named else {}), **opts)
