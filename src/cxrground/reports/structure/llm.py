"""LLM report structurer for any OpenAI-compatible chat-completions endpoint (ILS §7.1 and §7.2).

Two steps per report, as in ILS §7.2 (the reference used two models; here both steps use ``model``):

1. **Structuring** (prompt :data:`STRUCTURE_PROMPT` under ``prompts/``): the numbered section (``section_content``) ->
   findings ``{entity, sent_idx, assertion, lesion, location_phrases, hedge}`` (``hedge``, the grade of an
   uncertain finding's hedge, only with prompts that ask for it: structure_v5 on; a grade on a finding that is not
   uncertain, or one outside ``likely`` / ``possible``, is rejected and recorded, the finding kept ungraded).
2. **Location mapping** (prompt :data:`LOCATION_PROMPT`): the location phrases of every finding except
   cardiomegaly -> ILS labels. Skipped when no finding has a location phrase. Cardiomegaly always maps to
   ``heart``; a finding without phrases gets the default of :func:`.lexicon.default_location`
   (both lungs for lung lesions and effusion).

Requests ask for JSON-schema constrained output (``response_format = {"type": "json_schema", ...}``); when
the server rejects that (HTTP 400/422) the request is sent once more without it, and JSON is parsed from
the text (code fences and prose around the object are tolerated); the structurer then stops sending it.
Answers are validated with pydantic. Values outside the vocabulary are **rejected and recorded** in
:attr:`LLMStructurer.rejections`: a lesion name that is not one of the seven becomes None (the finding is
kept as a non-target finding), a location label that is not an ILS label is dropped, a finding whose
``sent_idx`` is not a sentence number is dropped.

Responses are cached in SQLite (:class:`cxrground.llm.ResponseCache`), keyed by the SHA-256 of the model's
identity (model, endpoint; the model alone with ``cache_endpoint=False``) + decoding settings + sample index 0 +
exact messages (:func:`cxrground.llm.cache_key`): a rerun makes zero requests. Requests go through
:class:`cxrground.llm.ChatClient`; batches run on one asyncio loop with at most ``concurrency`` reports (hence
requests) in flight (:func:`cxrground.llm.bounded_map`).
HTTP 408/409/425/429 and 5xx, timeouts and connection errors are retried by
:func:`cxrground.llm.call_with_retries` under a :class:`cxrground.llm.RetryPolicy` (``max_retries`` + 1
attempts; backoff with jitter, or the server's ``Retry-After``; unset options take the policy's defaults;
``timeout`` is the deadline of a whole request). Requests in flight follow a :class:`cxrground.llm.AdaptiveLimit`
shared with ``percept eval``: ``concurrency`` at first, halved by a 429 (down to 1), grown back by one per round of
successes. A report that still fails becomes a
:class:`~cxrground.errors.Failure` (stage ``structure``) and the batch goes on; so does a report whose structuring
raises any other error (recorded as ``unexpected error ...``). The batch stops instead with a
:class:`~cxrground.errors.BatchStopped` naming the URL and the reason when every report would fail alike: a 401, 403
or 404 (the key, the URL path, the model name); a redirect (not followed; the error names the ``Location``); a
``Retry-After`` above ``max_retry_after`` (a daily quota: not waited for, as in ``percept eval``); a request whose
retries all ended without an answer (refused, unknown host, timed out) while the server has not answered any request
yet (a wrong host or port, no server); and
:attr:`LLMStructurer.stop_after` (``max(8, 2 * concurrency)``) reports in a row whose requests spent their retries
without an answer (or with 5xx errors only) after the server had answered (it died or hangs; any answer resets the
count; the rule is :mod:`cxrground.llm.watch`, shared with ``percept eval``). The error says how
many reports were answered before it and whether the response cache keeps their answers for a rerun.

Answers: a thinking model's inline ``<think>`` block is removed before the JSON is read (:func:`strip_reasoning`,
:func:`extract_json`: the last JSON object that parses); an answer the server cut at ``max_tokens``
(``finish_reason`` ``length``) that does not parse fails saying so; a schema failure names the field. A cached answer
that does not decode or validate is a miss (``stats["cache_corrupt"]``), asked again and overwritten; identical
requests in flight at once (one cache key) are sent once (``stats["shared_in_flight"]``).
:meth:`LLMStructurer.stats_summary` is the one-line run summary of the CLI; while requests are retried,
:attr:`LLMStructurer.on_note` (when set) gets a note at most every ``note_every`` (10) seconds. A failed report's
:class:`~cxrground.errors.Failure` names the step, the HTTP status of an error answer and the attempts
(:class:`LLMError`). Numeric options out of range are a
:class:`~cxrground.errors.ConfigError` naming the option.

The API key is read from the environment variable named by ``api_key_env`` (never passed as a literal);
without it no ``Authorization`` header is sent (local servers). Every output records its provenance
(:attr:`LLMStructurer.provenance`: model, endpoint, decoding settings, prompt versions and the SHA-256 of
each rendered prompt); findings carry ``source = "llm:<model>"``.

The synchronous :meth:`LLMStructurer.structure` runs its own event loop (in a worker thread when the
calling thread already runs one); inside a running loop :meth:`LLMStructurer.structure_async` is cheaper
(its connections stay open for later calls on that loop until :meth:`LLMStructurer.aclose`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cxrground.errors import BatchStopped, ConfigError, CXRGroundError, Failure
from cxrground.llm import (
    AdaptiveLimit,
    CacheError,
    ChatClient,
    ClientError,
    EndpointRefused,
    PermanentError,
    ResponseCache,
    RetryPolicy,
    TransientError,
    WaitTooLong,
    bounded_each,
    bounded_map,
    cache_key,
    call_with_retries,
    run_sync,
)
from cxrground.llm.watch import NoAnswerRun, RetryNotes, retry_cause, stop_after
from cxrground.reports.findings import HEDGES, Finding, StructuredReport
from cxrground.reports.model import SectionChoice
from cxrground.reports.structure.lexicon import HEART_PROMINENCE_RE, EntityKind, default_location
from cxrground.reports.structure.resolve import RESOLVE_VERSION
from cxrground.vocab import HEART, ILS_LOCATION_LABELS, LESIONS
from cxrground.vocab.lesions import HEART_MASK_LESIONS

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_SEED",
    "LOCATION_PROMPT",
    "STAGE",
    "STRUCTURE_PROMPT",
    "LLMError",
    "LLMStructurer",
    "Prompt",
    "extract_json",
    "load_prompt",
    "retry_cause",
    "stats_line",
    "strip_reasoning",
]

#: Stage name of the :class:`~cxrground.errors.Failure` records.
STAGE: Final[str] = "structure"
#: Prompt versions (file stems under ``prompts/``).
STRUCTURE_PROMPT: Final[str] = "structure_v10"
LOCATION_PROMPT: Final[str] = "location_v6"
#: The decoding defaults of :class:`LLMStructurer`: most tokens of an answer, and the seed sent with each request.
DEFAULT_MAX_TOKENS: Final[int] = 2048
DEFAULT_SEED: Final[int] = 0


def _heart_finding(entity: str, lesion: str | None) -> bool:
    """Whether a non-target finding describes the heart (a prominent heart: located at the heart, as the rules do)."""
    return lesion is None and isinstance(entity, str) and HEART_PROMINENCE_RE.search(entity) is not None


_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_THINK_RE = re.compile(r"<think>.*?</think>", re.S | re.I)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
#: Positions a JSON object is tried from in an answer that is not plain JSON (a bound on the work for a long text).
_MAX_JSON_STARTS: Final[int] = 2000


class LLMError(CXRGroundError):
    """A request failed for good, or an answer could not be parsed or validated.

    ``step`` is the step that failed (``structure`` or ``location``), ``status`` the HTTP status of the error answer
    that failed it (None: no answer, or an answer of status 200 that could not be used) and ``attempts`` the requests
    the step sent (retries and a JSON-schema fallback included); None where not known.
    """

    def __init__(self, reason: str, *, step: str | None = None, status: int | None = None,
                 attempts: int | None = None) -> None:
        self.reason = reason
        self.step = step
        self.status = status
        self.attempts = attempts
        super().__init__(reason)

    def failure(self, path: str) -> Failure:
        """The :class:`~cxrground.errors.Failure` (stage ``structure``) of report ``path`` (its id) that this error
        failed, with its details."""
        return Failure(path=path, stage=STAGE, reason=self.reason, error=type(self).__name__, report=path,
                       step=self.step, http_status=self.status, attempts=self.attempts)


@dataclass(frozen=True)
class Prompt:
    """A versioned system prompt: ``version`` (file stem), rendered ``text`` and its ``sha256``."""

    version: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def load_prompt(version: str) -> Prompt:
    """Read ``prompts/<version>.md`` and fill ``{{LESIONS}}`` and ``{{LABELS}}`` from :mod:`cxrground.vocab`."""
    try:
        folder = resources.files("cxrground.reports.structure").joinpath("prompts")
        raw = folder.joinpath(f"{version}.md").read_text("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"unknown prompt version {version!r} (no prompts/{version}.md)") from None
    text = raw.replace("{{LESIONS}}", ", ".join(f"`{x}`" for x in LESIONS))
    text = text.replace("{{LABELS}}", ", ".join(f"`{x}`" for x in ILS_LOCATION_LABELS))
    return Prompt(version, text)


# --- answer models -----------------------------------------------------------------------------------------


class _LLMFinding(BaseModel):
    model_config = ConfigDict(extra="ignore")

    entity: str
    sent_idx: int
    assertion: Literal["present", "absent", "uncertain"]
    lesion: str | None = None
    location_phrases: list[str] = Field(default_factory=list)
    hedge: str | None = None


class _StructureAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    findings: list[_LLMFinding]


class _Mapping(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    labels: list[str]


class _LocationAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mappings: list[_Mapping]


def _structure_schema(hedge: bool = False) -> dict[str, Any]:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["findings"],
        "properties": {"findings": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["entity", "sent_idx", "assertion", "lesion", "location_phrases"],
            "properties": {
                "entity": {"type": "string"},
                "sent_idx": {"type": "integer"},
                "assertion": {"type": "string", "enum": ["present", "absent", "uncertain"]},
                "lesion": {"type": ["string", "null"], "enum": [*LESIONS, None]},
                "location_phrases": {"type": "array", "items": {"type": "string"}},
            },
        }}},
    }  # fmt: skip
    if hedge:  # prompts from structure_v5 on ask for the grade of an uncertain finding's hedge
        item = schema["properties"]["findings"]["items"]  # type: ignore[index]
        item["properties"]["hedge"] = {"type": ["string", "null"], "enum": [*HEDGES, None]}
        item["required"].append("hedge")
    return schema


def _location_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["mappings"],
        "properties": {"mappings": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "labels"],
            "properties": {
                "id": {"type": "integer"},
                "labels": {"type": "array", "items": {"type": "string", "enum": list(ILS_LOCATION_LABELS)}},
            },
        }}},
    }  # fmt: skip


def strip_reasoning(text: str) -> str:
    """``text`` without a thinking model's inline reasoning: every ``<think>...</think>`` block, everything up to a
    ``</think>`` whose ``<think>`` was in the prompt (chat templates that open the block), and an unclosed leading
    ``<think>`` tag."""
    text = _THINK_RE.sub("", text)
    close = text.lower().rfind(_THINK_CLOSE)
    if close >= 0:
        text = text[close + len(_THINK_CLOSE):]
    text = text.strip()
    if text.lower().startswith(_THINK_OPEN):
        text = text[len(_THINK_OPEN):]
    return text.strip()


def _last_object(text: str) -> tuple[Any, json.JSONDecodeError | None]:
    """The last JSON object in ``text`` that parses (scanning from each ``{`` not inside an object found), or None,
    with the error of the first ``{`` that did not parse."""
    decoder = json.JSONDecoder()
    found: Any = None
    first_error: json.JSONDecodeError | None = None
    pos = text.find("{")
    for _ in range(_MAX_JSON_STARTS):
        if pos < 0:
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            first_error = first_error or exc
            pos = text.find("{", pos + 1)
            continue
        found = value
        pos = text.find("{", end)
    return found, first_error


def extract_json(text: str) -> Any:
    """Parse a JSON object from model text: plain JSON, a fenced block (the last that parses), or the last ``{...}``
    that parses, after :func:`strip_reasoning` (a thinking model's ``<think>`` block, which may hold braces)."""
    text = strip_reasoning(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for block in reversed(_FENCE_RE.findall(text)):
        try:
            return json.loads(block.strip())
        except json.JSONDecodeError:
            continue
    found, error = _last_object(text)
    if found is not None:
        return found
    if error is not None:
        raise LLMError(f"answer is not valid JSON: {error.msg}")
    raise LLMError("answer contains no JSON object")


def stats_line(stats: Mapping[str, int]) -> str:
    """One line of an LLM structurer's counters (:attr:`LLMStructurer.stats`, or several added up): requests, cache
    hits, retries, schema fallbacks, rejections (and damaged cache rows asked again, answers shared by identical
    requests in flight, when there were any)."""

    def count(key: str, what: str) -> str:
        n = int(stats.get(key, 0))
        return f"{n} {what}" + ("" if n == 1 else "s")

    parts = [count("requests", "request"), count("cache_hits", "cache hit"), count("retries", "retry")
             .replace("retrys", "retries"), count("json_schema_fallbacks", "schema fallback"),
             count("rejections", "rejection")]
    if stats.get("cache_corrupt"):
        parts.append(f"{count('cache_corrupt', 'unreadable cache row')} asked again")
    if stats.get("shared_in_flight"):
        parts.append(f"{count('shared_in_flight', 'answer')} shared by identical requests in flight")
    return "LLM structurer: " + ", ".join(parts)


def _cut_note(max_tokens: int) -> str:
    """How a failure names an answer the server cut at ``max_tokens``."""
    return f"cut at max_tokens={max_tokens} (finish_reason=length); raise it with --max-tokens"


def _schema_problem(exc: ValidationError) -> str:
    """The first problem of a failed validation, with the field it is at (``findings.0.sent_idx: Field required``)."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where or 'the answer'}: {first.get('msg', 'invalid')}{more}"


def _check_number(name: str, value: float | None, low: float, *, low_open: bool = False,
                  high: float | None = None) -> None:
    """A :class:`ConfigError` naming option ``name`` unless ``value`` (None: unset) is a number in range."""
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")
        raise ConfigError(f"option {name} must be a number {bound}, got {value!r}")


class LLMStructurer:
    """:class:`~cxrground.reports.findings.Structurer` backed by an OpenAI-compatible chat-completions API.

    ``base_url`` is the API root (``http://host:port/v1``); requests go to ``{base_url}/chat/completions``.
    ``cache`` is a :class:`~cxrground.llm.ResponseCache`, a path to its SQLite file, or None (in-memory cache).
    Retry options left as None take the defaults of :class:`~cxrground.llm.RetryPolicy`.
    """

    name: str = "llm"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        top_p: float | None = None,
        seed: int | None = DEFAULT_SEED,
        timeout: float | None = None,
        max_retries: int | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        max_retry_after: float | None = None,
        concurrency: int = 4,
        cache: ResponseCache | str | Path | None = None,
        cache_endpoint: bool = True,
        json_schema: bool = True,
        structure_prompt: str = STRUCTURE_PROMPT,
        location_prompt: str = LOCATION_PROMPT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_url:
            raise ConfigError("the LLM structurer needs --base-url")
        if not model:
            raise ConfigError("the LLM structurer needs --model")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries is not None and max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"option max_tokens must be a whole number >= 1, got {max_tokens!r}")
        _check_number("temperature", temperature, 0)
        _check_number("top_p", top_p, 0, low_open=True, high=1)
        for name, value in (("timeout", timeout), ("backoff", backoff), ("max_backoff", max_backoff),
                            ("max_retry_after", max_retry_after)):
            _check_number(name, value, 0, low_open=name == "timeout")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"option seed must be a whole number, got {seed!r}")
        given = {"max_attempts": None if max_retries is None else max_retries + 1, "backoff": backoff,
                 "max_backoff": max_backoff, "max_retry_after": max_retry_after, "timeout": timeout}
        self.retry = RetryPolicy(**{k: v for k, v in given.items() if v is not None})
        self._chat = ChatClient(base_url, model, api_key_env=api_key_env, timeout=self.retry.timeout,
                                concurrency=concurrency, transport=transport)
        self.base_url = self._chat.base_url
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency = int(concurrency)
        self.json_schema = bool(json_schema)
        self.decoding: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if top_p is not None:
            self.decoding["top_p"] = top_p
        if seed is not None:
            self.decoding["seed"] = seed
        self.prompts = {"structure": load_prompt(structure_prompt), "location": load_prompt(location_prompt)}
        self.cache = cache if isinstance(cache, ResponseCache) else ResponseCache(cache or ":memory:")
        #: Whether cache keys hold the endpoint (default): False keys answers by the model name alone, so a server
        #: moved to another host reuses them (only where one model name means one set of weights everywhere).
        self.cache_endpoint = bool(cache_endpoint)
        self.source = f"llm:{model}"
        self.stats: Counter[str] = Counter()
        #: Values outside the vocabulary that were rejected: report id, field, value, reason.
        self.rejections: list[dict[str, Any]] = []
        self._random = random.Random()
        #: Requests in flight by cache key (identical requests at the same time are sent once).
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        #: Reports in a row whose request spent its retries without an answer (see :attr:`stop_after`).
        self._no_answer = NoAnswerRun(concurrency, "the LLM structurer stops", "reports",
                                      f"{self._chat.base_url}/chat/completions")
        #: Requests in flight: ``concurrency`` at first, halved by a 429 (:class:`cxrground.llm.AdaptiveLimit`).
        self._limit = AdaptiveLimit(concurrency)
        self._notes = RetryNotes("LLM structurer", limit=self._limit)

    @property
    def timeout(self) -> float:
        """Deadline of one request in seconds (connect, send and the whole answer)."""
        return self.retry.timeout

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt."""
        return self.retry.max_attempts - 1

    @property
    def stop_after(self) -> int:
        """Reports in a row whose request got no answer (timeouts, connection errors, only 5xx) after all its retries
        that stop the batch: ``max(8, 2 * concurrency)`` (:func:`cxrground.llm.watch.stop_after`)."""
        return stop_after(self.concurrency)

    @property
    def on_note(self) -> Callable[[str], None] | None:
        """Called with a one-line note while requests are retried (at most one every :attr:`note_every` seconds:
        how many requests are between attempts, the causes since the last note, the next wait); None: silent."""
        return self._notes.on_note

    @on_note.setter
    def on_note(self, note: Callable[[str], None] | None) -> None:
        self._notes.on_note = note

    @property
    def note_every(self) -> float:
        """Seconds between two retry notes (10)."""
        return self._notes.every

    @note_every.setter
    def note_every(self, seconds: float) -> None:
        self._notes.every = seconds

    def stats_summary(self) -> str:
        """One line of this structurer's counters (:func:`stats_line`)."""
        return stats_line(self.stats)

    # -- provenance ---------------------------------------------------------------------------------------------

    @property
    def _cache_identity(self) -> dict[str, Any]:
        """The model's identity in cache keys: the client's (kind, model, endpoint), without the endpoint when
        :attr:`cache_endpoint` is false."""
        identity = self._chat.identity
        return identity if self.cache_endpoint else {k: v for k, v in identity.items() if k != "base_url"}

    @property
    def provenance(self) -> dict[str, Any]:
        """Model, endpoint, decoding settings, prompt versions + SHA-256 and the version of the report-level rules,
        recorded with every output."""
        return {
            "structurer": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "decoding": dict(self.decoding),
            "json_schema": self.json_schema,
            "prompts": {step: {"version": p.version, "sha256": p.sha256} for step, p in self.prompts.items()},
            "resolve": RESOLVE_VERSION,
        }

    # -- public API ---------------------------------------------------------------------------------------------

    def structure(self, report_id: str, section: SectionChoice) -> StructuredReport:
        """Structured findings of ``section``; raises :class:`LLMError` when the report fails."""
        return run_sync(self._run_one(report_id, section))

    async def structure_async(self, report_id: str, section: SectionChoice) -> StructuredReport:
        """Async form of :meth:`structure` (connections stay pooled on this loop until :meth:`aclose`)."""
        return await self._structure(report_id, section)

    async def aclose(self) -> None:
        """Close the HTTP connections opened by :meth:`structure_async` on the running loop."""
        await self._chat.aclose()

    def structure_many(
        self,
        items: Sequence[tuple[str, SectionChoice]],
        progress: bool = False,
        on_done: Callable[[], None] | None = None,
    ) -> tuple[list[StructuredReport], list[Failure]]:
        """Structure ``(report_id, section)`` pairs concurrently; results keep the input order.

        A report that fails after the retries becomes a :class:`~cxrground.errors.Failure` (path and ``report`` =
        report id, stage ``structure``; ``step``, ``http_status`` and ``attempts`` of an :class:`LLMError`).
        ``on_done`` is called after each report (progress bars).
        """
        return run_sync(self._run_many(list(items), progress, on_done))

    def warm_cache(self, items: Iterable[tuple[str, SectionChoice]], progress: bool = False) -> Counter[str]:
        """Structure every ``(report_id, section)`` of ``items`` with :attr:`concurrency` requests in flight, for
        the cache only: ``items`` is read lazily and no result is kept, so any number of reports fits in memory, and
        a later :meth:`structure` of the same section is answered from the cache. Interrupted and run again, it
        sends only what the cache does not hold yet. Returns counts: ``reports``, ``failed`` (after the retries;
        left for the per-report call to record) and this structurer's request counters."""
        return run_sync(self._warm(items, progress))

    async def _warm(self, items: Iterable[tuple[str, SectionChoice]], progress: bool) -> Counter[str]:
        from cxrground.io.progress import progress_bar

        bar = progress_bar(desc="structure (LLM)", unit="report", progress=progress)
        counts: Counter[str] = Counter()

        async def one(item: tuple[str, SectionChoice]) -> None:
            counts["reports"] += 1
            try:
                await self._structure(*item)
            except BatchStopped:
                raise
            except Exception:  # an LLMError or an error of this report: left for the per-report call to record
                counts["failed"] += 1
            else:
                counts["answered"] += 1

        try:
            await bounded_each(one, items, self.concurrency, lambda _: bar.update(1))
        except BatchStopped as exc:
            raise self._stopped(exc, counts["answered"], None) from None
        finally:
            bar.close()
            await self._chat.aclose()
        return counts + Counter({k: v for k, v in self.stats.items() if v})

    def _stopped(self, exc: BatchStopped, answered: int, total: int | None) -> BatchStopped:
        """``exc`` with how many reports were answered before it, and whether a rerun resumes from them."""
        of = f" of {total}" if total is not None else ""
        note = f"{answered}{of} reports were answered before the stop"
        if isinstance(exc, CacheError):
            pass
        elif self.cache.path != ":memory:":
            note += (f"; their answers are in the response cache {self.cache.path}, so a rerun with it resumes where "
                     "this run stopped")
        elif answered:
            note += (" and kept in memory only: give a response cache file (--cache FILE) so that a rerun resumes "
                     "where a run stopped")
        else:
            note += "; a response cache file (--cache FILE) lets a rerun resume where a run stopped"
        return BatchStopped(f"{exc}. {note}")

    # -- batch machinery -----------------------------------------------------------------------------------------

    async def _run_one(self, report_id: str, section: SectionChoice) -> StructuredReport:
        try:
            return await self._structure(report_id, section)
        finally:
            await self._chat.aclose()

    async def _run_many(
        self, items: list[tuple[str, SectionChoice]], progress: bool, on_done: Callable[[], None] | None
    ) -> tuple[list[StructuredReport], list[Failure]]:
        from cxrground.io.progress import progress_bar

        bar = progress_bar(total=len(items), desc="structure", unit="report", progress=progress)

        answered = 0

        async def one(item: tuple[str, SectionChoice]) -> StructuredReport | Failure:
            nonlocal answered
            report_id, section = item
            try:
                done = await self._structure(report_id, section)
            except BatchStopped:
                raise
            except LLMError as exc:
                self.stats["failures"] += 1
                return exc.failure(report_id)
            except Exception as exc:  # an error of this report only: recorded, the other reports go on
                self.stats["failures"] += 1
                return Failure(path=report_id, stage=STAGE, error=type(exc).__name__, report=report_id,
                               reason=f"unexpected error structuring report {report_id!r}: {type(exc).__name__}: {exc}")
            answered += 1
            return done

        def done_one(_: object) -> None:
            bar.update(1)
            if on_done is not None:
                on_done()

        try:
            results = await bounded_map(one, items, self.concurrency, done_one)
        except BatchStopped as exc:
            raise self._stopped(exc, answered, len(items)) from None
        finally:
            bar.close()
            await self._chat.aclose()
        done = [r for r in results if isinstance(r, StructuredReport)]
        failed = [r for r in results if isinstance(r, Failure)]
        return done, failed

    def _retried(self, exc: TransientError, wait: float, request: list[bool]) -> None:
        """Count a retry of one request (``request``: whether it retried before) and note it (:attr:`on_note`)."""
        self.stats["retries"] += 1
        self._notes.retried(exc, wait, request)

    async def _send(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> tuple[str, str | None, int]:
        """One chat completion with retries (and the JSON-schema fallback); returns the assistant text, the
        ``finish_reason`` and the attempts it took."""

        async def attempt() -> tuple[str | None, str | None]:
            self.stats["requests"] += 1
            completion = await self._chat.complete(messages, params)
            return completion.content, completion.finish_reason

        retried: list[bool] = []
        sent = 0

        def note(exc: TransientError, wait: float) -> None:
            self._retried(exc, wait, retried)

        try:
            try:
                (text, finish), sent = await call_with_retries(attempt, self.retry, rng=self._random,
                                                               on_retry=note, limit=self._limit)
            except PermanentError as exc:
                if exc.status not in (400, 422) or "response_format" not in params:
                    raise
                # no JSON-schema output on this server: ask again without it (and stop sending it)
                sent = exc.attempts or 1
                self.json_schema = False
                self.stats["json_schema_fallbacks"] += 1
                params = {k: v for k, v in params.items() if k != "response_format"}
                (text, finish), more = await call_with_retries(attempt, self.retry, rng=self._random,
                                                               on_retry=note, limit=self._limit)
                sent += more
        except WaitTooLong as exc:  # a quota used up: every report would wait alike
            raise BatchStopped(f"the LLM structurer stops: {exc.stop_line('--structurer-opt max_retry_after')}"
                               ) from None
        except EndpointRefused as exc:  # the key, URL or model name, a redirect: every report would fail alike
            raise BatchStopped(f"the LLM structurer stops: {exc.reason}") from None
        except ClientError as exc:
            self._no_answer_stop(exc)
            status = exc.status if exc.status is not None and not 200 <= exc.status < 300 else None
            raise LLMError(exc.reason, status=status, attempts=sent + (exc.attempts or 1)) from None
        finally:
            self._notes.done(retried)
        self._no_answer.answered()
        if text is None:
            raise LLMError("chat-completion message has no text content"
                           + (f" ({_cut_note(self.decoding['max_tokens'])})" if finish == "length" else ""),
                           attempts=sent)
        return text, finish, sent

    def _no_answer_stop(self, exc: ClientError) -> None:
        """Stop the batch when a request that spent its retries (``exc``) says the server is gone: never answered
        yet (a wrong URL or port, no server), or :attr:`stop_after` reports in a row got no answer
        (:class:`cxrground.llm.watch.NoAnswerRun`)."""
        stop = self._no_answer.failed(exc, self._chat.answered)
        if stop is not None:
            raise BatchStopped(stop)

    async def _ask(
        self,
        step: str,
        user: str,
        schema_name: str,
        schema: dict[str, Any],
        model_cls: type[BaseModel],
    ) -> Any:
        """One step: cached answer or a request; returns the validated pydantic object. A cached row that does not
        read as a valid answer is asked again (and overwritten); an identical request already in flight is waited
        for instead of sent again."""
        messages = [{"role": "system", "content": self.prompts[step].text}, {"role": "user", "content": user}]
        key = cache_key(self._cache_identity, self.decoding, messages)
        cached = self.cache.get(key)
        if cached is not None:
            try:
                answer = model_cls.model_validate(json.loads(cached))
            except ValueError:  # not JSON, or not this schema (pydantic's ValidationError is a ValueError)
                self.stats["cache_corrupt"] += 1
            else:
                self.stats["cache_hits"] += 1
                return answer
        loop = asyncio.get_running_loop()
        pending = self._inflight.get(key)
        if pending is not None and pending.get_loop() is loop:
            self.stats["shared_in_flight"] += 1
            return await asyncio.shield(pending)
        future: asyncio.Future[Any] = loop.create_future()
        self._inflight[key] = future
        try:
            answer = await self._request(step, key, messages, schema_name, schema, model_cls)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        else:
            future.set_result(answer)
        finally:
            if self._inflight.get(key) is future:
                del self._inflight[key]
        return answer

    async def _request(self, step: str, key: str, messages: list[dict[str, Any]], schema_name: str,
                       schema: dict[str, Any], model_cls: type[BaseModel]) -> Any:
        """Send one step's request, validate the answer and store it in the cache."""
        params: dict[str, Any] = dict(self.decoding)
        if self.json_schema:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "strict": True, "schema": schema},
            }
        try:
            text, finish, sent = await self._send(messages, params)
        except LLMError as exc:
            exc.step = step
            raise
        try:
            answer = model_cls.model_validate(extract_json(text))
        except (LLMError, ValidationError) as exc:
            if finish == "length":
                raise LLMError(f"{step} answer {_cut_note(self.decoding['max_tokens'])}", step=step,
                               attempts=sent) from None
            if isinstance(exc, LLMError):
                raise LLMError(exc.reason, step=step, attempts=sent) from None
            raise LLMError(f"{step} answer does not match the schema: {_schema_problem(exc)}", step=step,
                           attempts=sent) from None
        self.cache.put(key, self.model, {"model": self._cache_identity, "decoding": self.decoding, "sample": 0,
                                         "messages": messages}, answer.model_dump_json())
        return answer

    # -- one report ---------------------------------------------------------------------------------------------

    def _reject(self, report_id: str, field: str, value: Any, reason: str) -> None:
        self.stats["rejections"] += 1
        self.rejections.append({"report_id": report_id, "field": field, "value": value, "reason": reason})

    async def _structure(self, report_id: str, section: SectionChoice) -> StructuredReport:
        user = f"Report section ({section.name}):\n{section.section_content}"
        graded = "`hedge`" in self.prompts["structure"].text
        answer: _StructureAnswer = await self._ask("structure", user, "ils_findings",
                                                   _structure_schema(graded), _StructureAnswer)
        n = len(section.sentences)
        kept: list[tuple[_LLMFinding, str | None]] = []
        for f in answer.findings:
            if not 1 <= f.sent_idx <= n:
                self._reject(report_id, "sent_idx", f.sent_idx, f"not a sentence number (1..{n})")
                continue
            lesion = f.lesion.strip().lower() if isinstance(f.lesion, str) and f.lesion.strip() else None
            if lesion is not None and lesion not in LESIONS:
                self._reject(report_id, "lesion", f.lesion, "not one of the seven lesions; kept as non-target")
                lesion = None
            kept.append((f, lesion))

        # step 2: location mapping of every finding with phrases (cardiomegaly is always the heart)
        items = [
            {"id": k, "entity": f.entity, "lesion": lesion, "sentence": section.sentence(f.sent_idx).text,
             "location_phrases": [p for p in f.location_phrases if p.strip()]}
            for k, (f, lesion) in enumerate(kept)
            if lesion not in HEART_MASK_LESIONS and not _heart_finding(f.entity, lesion)
            and any(p.strip() for p in f.location_phrases)
        ]
        mapped: dict[int, list[str]] = {}
        if items:
            loc: _LocationAnswer = await self._ask(
                "location", json.dumps(items, ensure_ascii=False), "ils_locations",
                _location_schema(), _LocationAnswer)
            wanted = {item["id"] for item in items}
            for m in loc.mappings:
                if m.id not in wanted:
                    self._reject(report_id, "mapping_id", m.id, "no such item")
                    continue
                labels = []
                for label in m.labels:
                    norm = " ".join(label.lower().split())
                    if norm in ILS_LOCATION_LABELS:
                        labels.append(norm)
                    else:
                        self._reject(report_id, "label", label, "not an ILS location label")
                mapped[m.id] = list(dict.fromkeys(labels))

        findings = []
        for k, (f, lesion) in enumerate(kept):
            phrases = tuple(p for p in f.location_phrases if p.strip())
            if lesion in HEART_MASK_LESIONS or _heart_finding(f.entity, lesion):
                labels: tuple[str, ...] = (HEART,)
                phrases = ()
            else:
                labels = tuple(mapped.get(k) or ())
                if not labels:  # non-target findings default to both lungs too (the conservative choice for EL)
                    labels = default_location(EntityKind("llm", lesion, lung=True))
            hedge = f.hedge.strip().lower() if isinstance(f.hedge, str) and f.hedge.strip() else None
            if hedge is not None and (hedge not in HEDGES or f.assertion != "uncertain"):
                self._reject(report_id, "hedge", f.hedge, f"not a hedge grade of an uncertain finding ({f.assertion})")
                hedge = None
            findings.append(Finding(
                entity=f.entity, sent_idx=f.sent_idx, assertion=f.assertion, lesion=lesion,
                location_phrases=phrases, reported_location=labels, source=self.source,
                hedge=hedge,  # type: ignore[arg-type]
            ))
        return StructuredReport(report_id=report_id, section=section, findings=tuple(findings))
