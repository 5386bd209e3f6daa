"""``percept eval``: run a model on a CheXpercept benchmark, concurrent across cases, cached and resumable.

- Cases run concurrently (asyncio; ``concurrency`` workers, one case each at a time,
  :func:`cxrground.llm.bounded_map`), turns in order within a case (§13.2).
- ``repeats`` N (default 1): every case is run N times (samples ``0..N-1``) at the run's temperature; the
  unit of work, of resume and of ``results.jsonl`` is (case, repeat). Sample ``k`` uses seed
  :func:`sample_seed` (the run's ``seed`` for ``k = 0``): sent with each request when sampling
  (temperature > 0), used by the random baseline always. With N = 1 the files are as before (no
  ``repeat`` field, no ``repeats`` in ``config.json``).
- Every request of every client, built-in baselines included, goes through the response cache
  (:mod:`.cache`): key = client identity + decoding settings (+ the sample's seed when sampling) + sample index + exact
  messages (+ the baselines' case/question context); with ``cache_endpoint=False`` the identity leaves out the
  endpoint (``base_url``), so the same model served at another URL reuses the answers. Rerunning, resuming or
  switching oracle setting never repeats an answered request (the first request of a case is the same under every
  oracle setting, so Stage 1 is always reused), while repeat ``k`` never reuses repeat ``j``'s answer. Default
  cache file: ``percept_cache.sqlite`` next to the RUN folder, so sibling runs share it. An empty reply (null
  or blank content, maybe a transient glitch) is scored as unparseable in the case that got it but never cached
  (nor taken from the cache), so every later request of it (another run, a resumed unfinished case) asks again.
- Transient errors (408/409/425/429, 5xx, timeouts, connection errors) are retried by
  :func:`cxrground.llm.call_with_retries` under a :class:`~cxrground.llm.RetryPolicy` (``max_attempts``
  attempts in all, backoff with jitter or the server's ``Retry-After``). Requests in flight follow a
  :class:`~cxrground.llm.AdaptiveLimit`: ``concurrency`` at first, halved by a 429 (down to 1), grown back by one
  per round of successes; the retry notes say how many a rate limit left. A ``Retry-After`` above
  ``max_retry_after`` (a daily quota) stops the run (:class:`~cxrground.llm.WaitTooLong`): what was done is kept
  and a rerun resumes. A redirect is not followed (:class:`~cxrground.llm.Redirected`) and stops the run,
  naming the ``Location``. A case that
  still fails is recorded with ``status: "failed"`` and the error; its unanswered questions are recorded
  with label ``failed``, and scoring counts all its stages wrong. An endpoint that refuses a request with 401,
  403 or 404 (the key, the URL or the model name; :class:`~cxrground.llm.EndpointRefused`) stops the run with a
  :class:`~cxrground.errors.ConfigError`: every case would fail alike; so does a server that no request of the
  run has reached when a request's retries are spent on connection failures (refused, unknown host: a wrong
  ``--base-url`` or no server yet). Once the server has answered, such a failure fails only its case.
- ``RUN/`` holds ``config.json`` (the settings that determine results and their SHA-256, the model's
  ``identity`` included: the checkpoint digest of an ``ils:`` model, the folder fingerprint of an ``hf:`` model;
  a RUN made with a different configuration, or with another model at the same path, is refused),
  ``cases.json`` (the selected cases' plans without texts, the
  denominators of scoring), ``results.jsonl`` (append-only, one line per finished case and repeat) and
  ``usage.json`` (the decoding settings sent, tokens, request counts, model versions seen, cost when the price
  table has the model: the built-in one of :mod:`.prices`, or a ``prices`` file merged over it). ``usage.json``
  is rewritten after every answer and every finished case (atomically), so a killed session's requests, tokens,
  retries and cache hits are kept; only the requests in flight at the kill (no answer yet) are not counted.
- ``extra_body`` (openai clients only): request options merged into every request; part of the decoding
  settings, hence of the cache key and of ``config.json`` (absent from both when not given).
- ``sampling_params`` (``openai:`` and ``hf:`` clients): ``explicit`` sends every sampling parameter at the
  reference's vLLM values, so that no generation-config default of the server or the model applies; ``minimal``
  sends temperature and the token limit only (hosted APIs; the requests of earlier versions); ``auto`` (default)
  is ``minimal`` for a hosted API's base URL and ``explicit`` otherwise. Its effect is the client's ``decoding``
  (config.json, usage.json, the cache key), not a setting of its own.
- The benchmark file is untrusted: it is refused as a whole before anything runs when it has no cases, a
  case with an unknown lesion or without a question of its path, or an image path outside its folder
  (:func:`~.conversation.plan_benchmark`); images are read only through
  :func:`~.conversation.safe_image_path`. A benchmark whose image files are not all there (an unfinished or
  interrupted ``percept build``) is refused naming the missing files (:func:`check_case_files`).
- Resume: units already in ``results.jsonl`` are skipped (``retry_failed`` re-runs the failed ones; the
  last line of a unit wins); a partially run case is re-run and its answered turns come from the cache.
  A torn last line (kill during a write) is cut off before appending. Lines that hold no valid record are
  skipped (:func:`read_results` lists them; ``percept score`` reports each by file and line), so their units
  run again.
- Selection (deterministic): cases ordered by SHA-256 of ``{seed}:{case_id}``; ``per_path_limit`` keeps the
  first N of each path in that order, then ``limit`` the first N overall. ``selection="reference"`` selects as the
  reference evaluator's flags of the same names do (to score or replay the same cases as a reference run): cases
  in benchmark file order; ``per_path_limit`` keeps the first N lesion-free, then revision-free, then
  revision-required cases; ``limit`` the first N (one of the two, as the reference lets ``per_path_limit``
  override ``limit``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from cxrground.errors import BatchStopped, ConfigError, CXRGroundError, InputError
from cxrground.evaluation.percept.cache import PerceptCache, percept_cache_key
from cxrground.evaluation.percept.clients import Client, Completion, make_client
from cxrground.evaluation.percept.conversation import (
    ORACLE_SETTINGS,
    CasePlan,
    Conversation,
    Question,
    image_data_url,
    plan_benchmark,
    safe_image_path,
)
from cxrground.evaluation.percept.parsing import is_correct, parse_answer
from cxrground.evaluation.percept.prices import PRICES, Price, cost_usd, price_of, price_table
from cxrground.io.files import atomic_write_text, flat_json, sha256_file, sha256_json
from cxrground.io.output_lock import locks_output
from cxrground.llm import (
    AdaptiveLimit,
    ClientError,
    EndpointRefused,
    RetryPolicy,
    TimedOut,
    WaitTooLong,
    bounded_map,
    call_with_retries,
    run_sync,
)
from cxrground.llm.watch import NoAnswerRun, RetryNotes, got_no_answer
from cxrground.percept.paths import check_outside_benchmark
from cxrground.percept.schema import BENCHMARK_FILE, Benchmark, load_benchmark
from cxrground.registry import backend_errors, backend_label, check_returned

__all__ = ["CACHE_FILE", "SELECTIONS", "BadLine", "EvalSettings", "ResultLines", "RetryPolicy", "case_record",
           "check_case_files", "cut_reason", "load_all_results", "load_results", "read_results", "record_answer",
           "record_cut", "record_problem", "reply_notes", "run_eval", "run_summary_line", "sample_seed",
           "select_cases"]

CACHE_FILE: Final[str] = "percept_cache.sqlite"
CONFIG_FILE: Final[str] = "config.json"
CASES_FILE: Final[str] = "cases.json"
RESULTS_FILE: Final[str] = "results.jsonl"
USAGE_FILE: Final[str] = "usage.json"
HARNESS_VERSION: Final[int] = 1


@dataclass(frozen=True)
class EvalSettings:
    """Everything that determines a run's results (hashed into ``config.json``)."""

    bench: Path
    model: str
    oracle: str = "implicit"
    temperature: float = 0.0
    max_tokens: int = 8192
    top_p: float | None = None
    seed: int = 0
    limit: int | None = None
    per_path_limit: int | None = None
    max_images: int = 7
    repeats: int = 1
    extra_body: dict[str, Any] | None = None
    sampling_params: str = "auto"
    selection: str = "hash"


#: The token counts a response reports (usage.json).
_TOKEN_KEYS: Final[tuple[str, ...]] = ("prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass
class _Stats:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failed_cases: int = 0
    #: Failed cases whose request got no answer from the server (refused, timed out, reset, only 5xx).
    no_answer_cases: int = 0
    #: Answers the server cut at max_tokens (finish_reason ``length``): recorded as failed questions.
    cut_answers: int = 0
    #: Replies without answer text (null, blank, reasoning only), and those of them that held tool calls.
    empty_replies: int = 0
    tool_call_replies: int = 0
    #: Cached rows that did not read as a response record: asked again and overwritten.
    cache_corrupt: int = 0
    model_versions: set[str] = field(default_factory=set)
    #: Tokens of every response received from the model in this session (cases finished or not).
    tokens_sent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TOKEN_KEYS, 0))


#: Case selections (module docstring): by a hash of the seed and case id, or as the reference evaluator's flags.
SELECTIONS: Final[tuple[str, ...]] = ("hash", "reference")
#: The reference evaluator's order of the paths under ``--per_path_limit`` (lesion-free, revision-free, -required).
_REFERENCE_PATH_ORDER: Final[tuple[str, ...]] = ("LF", "RF", "RR")


def select_cases(plans: Sequence[CasePlan], seed: int, limit: int | None = None,
                 per_path_limit: int | None = None, selection: str = "hash") -> list[CasePlan]:
    """The deterministic selection of the module docstring (``plans`` in benchmark file order)."""
    if selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
    if selection == "reference":
        if limit is not None and per_path_limit is not None:
            raise ConfigError("--selection reference takes --limit or --per-path-limit, not both (the reference "
                              "evaluator ignores --limit when --per_path_limit is given)")
        if per_path_limit is None:
            return list(plans[:limit] if limit is not None else plans)
        paths = [*_REFERENCE_PATH_ORDER, *sorted({p.path for p in plans} - set(_REFERENCE_PATH_ORDER))]
        return [p for path in paths for p in [q for q in plans if q.path == path][:per_path_limit]]
    order = sorted(plans, key=lambda p: hashlib.sha256(f"{seed}:{p.case_id}".encode()).hexdigest())
    if per_path_limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in order:
            if seen.get(p.path, 0) < per_path_limit:
                seen[p.path] = seen.get(p.path, 0) + 1
                kept.append(p)
        order = kept
    return order[:limit] if limit is not None else order


def sample_seed(seed: int, sample: int) -> int:
    """The seed of sample ``sample`` of a run with ``seed``: ``seed`` itself for sample 0, else a 31-bit hash."""
    if sample == 0:
        return int(seed)
    return int.from_bytes(hashlib.sha256(f"{seed}:{sample}".encode()).digest()[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class BadLine:
    """A line of ``results.jsonl`` that holds no valid result record: the file, the line number, why, and the
    unit (case id, repeat) it names when that can still be read from it."""

    path: str
    line: int
    reason: str
    case_id: str | None = None
    repeat: int = 0
    torn: bool = False  # the last line, without its newline: a write cut short by a kill

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class ResultLines:
    """``results.jsonl`` read line by line: the last valid record of each unit (case id, repeat) with its line
    number, and every line that holds no valid record."""

    records: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    line_of: dict[tuple[str, int], int] = field(default_factory=dict)
    bad: list[BadLine] = field(default_factory=list)

    def broken_units(self) -> dict[tuple[str, int], BadLine]:
        """Units whose last line naming them is a bad one (not a torn last line): their result is lost."""
        out: dict[tuple[str, int], BadLine] = {}
        for b in self.bad:
            unit = (b.case_id, b.repeat)
            if b.case_id is not None and not b.torn and b.line > self.line_of.get(unit, 0):  # type: ignore[arg-type]
                out[unit] = b  # type: ignore[index]
        return out


_JSON_TYPES: Final[dict[type, str]] = {list: "an array", str: "a string", int: "a number", float: "a number",
                                       bool: "true/false", type(None): "null"}
_CASE_ID = re.compile(rb'"case_id"\s*:\s*"([^"\\]{1,400})"')
_REPEAT = re.compile(rb'"repeat"\s*:\s*(\d{1,9})\b')


def record_problem(rec: Any) -> str | None:
    """Why ``rec`` is not a valid ``results.jsonl`` record (None when it is): an object with a ``case_id``, an
    optional non-negative ``repeat``, a ``status`` of ok / failed, and a ``questions`` list whose items have a
    ``qid`` and a true/false ``correct`` (and ``correct_lenient``, ``label`` of the right types where given)."""
    if not isinstance(rec, dict):
        return f"not a result record (a JSON object) but {_JSON_TYPES.get(type(rec), type(rec).__name__)}"
    if not isinstance(rec.get("case_id"), str) or not rec["case_id"]:
        return "no case_id (a non-empty string)"
    repeat = rec.get("repeat", 0)
    if type(repeat) is not int or repeat < 0:
        return f"repeat {repeat!r} is not a non-negative integer"
    if rec.get("status", "ok") not in ("ok", "failed"):
        return f"status {rec.get('status')!r} is neither 'ok' nor 'failed'"
    questions = rec.get("questions")
    if not isinstance(questions, list):
        return "no questions list"
    for k, q in enumerate(questions, start=1):
        if not isinstance(q, dict) or not isinstance(q.get("qid"), str):
            return f"question {k} is not an object with a qid"
        for name in ("correct", "correct_lenient"):
            if (name in q or name == "correct") and not isinstance(q.get(name), bool):
                return f"question {k} ({q['qid']}): {name} is {q.get(name)!r}, not true or false"
        if "label" in q and not isinstance(q["label"], str):
            return f"question {k} ({q['qid']}): label {q['label']!r} is not a string"
    return None


def read_results(run: Path) -> ResultLines:
    """``RUN/results.jsonl`` line by line (last line per unit wins; no ``repeat`` field = 0): valid records, and
    every non-blank line that is not UTF-8, not JSON or not a valid record (:func:`record_problem`) as a
    :class:`BadLine`."""
    path = Path(run) / RESULTS_FILE
    out = ResultLines()
    if not path.is_file():
        return out
    pieces = path.read_bytes().split(b"\n")
    for number, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        rec: Any = None
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 text (byte {exc.start + 1} of the line)"
        except json.JSONDecodeError as exc:
            reason = f"invalid JSON ({exc.msg}, column {exc.colno})"
        else:
            reason = record_problem(rec)
            if reason is None:
                unit = (rec["case_id"], rec.get("repeat", 0))
                out.records[unit], out.line_of[unit] = rec, number
                continue
        torn = number == len(pieces)
        if isinstance(rec, dict) and isinstance(rec.get("case_id"), str):
            case_id: str | None = rec["case_id"]
            repeat = rec.get("repeat", 0) if type(rec.get("repeat", 0)) is int else 0
        else:
            found, rep = _CASE_ID.search(raw), _REPEAT.search(raw)
            case_id = found.group(1).decode("utf-8", "replace") if found else None
            repeat = int(rep.group(1)) if rep else 0
        if torn:
            reason += "; the last line, cut short (an interrupted write): its case counts as missing"
        elif case_id is None:
            reason += "; it names no case"
        else:
            reason += f"; case {case_id}" + (f" repeat {repeat}" if repeat else "") + " counts as failed"
        out.bad.append(BadLine(str(path), number, reason, case_id, repeat, torn))
    return out


def load_all_results(run: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(case id, repeat) -> last valid result line of ``RUN/results.jsonl`` (no ``repeat`` field = 0; lines that
    hold no valid record are left out: :func:`read_results` lists them)."""
    return read_results(run).records


def load_results(run: Path, repeat: int = 0) -> dict[str, dict[str, Any]]:
    """Case id -> last result line of repeat ``repeat`` in ``RUN/results.jsonl``."""
    return {cid: rec for (cid, k), rec in load_all_results(run).items() if k == repeat}


def _repair_tail(path: Path) -> None:
    """Make appends start on a fresh line: a last line without its newline is cut off when it is torn (no valid
    record), completed with a newline when it holds one."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        tail = data[data.rfind(b"\n") + 1:]
        try:
            whole = record_problem(json.loads(tail.decode("utf-8"))) is None
        except (UnicodeDecodeError, json.JSONDecodeError):
            whole = False
        if whole:
            with path.open("ab") as fh:
                fh.write(b"\n")
        else:
            path.write_bytes(data[: data.rfind(b"\n") + 1])


def _bench_file(bench: Path) -> Path:
    """The benchmark JSON of ``--bench`` (a folder or the file itself)."""
    bench = Path(bench)
    return bench / BENCHMARK_FILE if bench.is_dir() else bench


#: Identity fields that locate a model rather than say what it is: left out of ``config.json``.
_LOCATION_KEYS: Final[frozenset[str]] = frozenset({"kind", "model", "base_url", "checkpoint"})


def cache_identity(client: Client, endpoint: bool = True) -> dict[str, Any]:
    """The client's identity as the response cache keys it: with the client's ``kind`` added when the identity does
    not name it, so two kinds of client whose identities agree (two plug-ins that name only the model) never answer
    from each other's cached responses; without its endpoint (``base_url``) when ``endpoint`` is false
    (``cache_endpoint=False``)."""
    identity = dict(client.identity)
    if not endpoint:
        identity.pop("base_url", None)
    if identity.get("kind") != client.kind:
        identity["client_kind"] = client.kind
    return identity


def _model_identity(client: Client) -> dict[str, Any]:
    """What the client's identity says about the model's content (the checkpoint digest of ``ils:``, the folder
    fingerprint of ``hf:``, the seed of a baseline): part of ``config.json``, so a model replaced at the same path
    is refused on resume. Where it is served from (an ``openai:`` endpoint, a path) is not part of it."""
    ident = {k: v for k, v in client.identity.items() if k not in _LOCATION_KEYS}
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def _config(settings: EvalSettings, client: Client, n_cases: int) -> dict[str, Any]:
    bench_file = _bench_file(settings.bench)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    if settings.repeats == 1:
        del cfg["repeats"]  # one sample: the configuration (and its hash) of runs made before repeats existed
    if not settings.extra_body:
        del cfg["extra_body"]  # likewise for runs made before --extra-body existed
    # its effect is the client's decoding below (what is sent); runs made before it existed sent "minimal" and keep
    # their configuration hash, and clients without decoding settings (baselines, ils:) are not affected
    del cfg["sampling_params"]
    if settings.selection == "hash":
        del cfg["selection"]  # the selection of runs made before --selection existed
    cfg["bench"] = str(bench_file.resolve().parent)
    cfg["bench_sha256"] = sha256_file(bench_file)
    cfg["client"] = {"kind": client.kind, "model": client.model, "decoding": client.decoding}
    identity = _model_identity(client)
    if identity:
        cfg["client"]["identity"] = identity
    cfg["n_cases"] = n_cases
    cfg["harness_version"] = HARNESS_VERSION
    return cfg


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_case_files(bench: Benchmark, plans: Sequence[CasePlan], source: Path) -> None:
    """Raise :class:`InputError` naming the files when an image of ``plans`` or a file listed in the benchmark's
    ``MANIFEST.sha256`` is not there (an unfinished or interrupted ``percept build``), or when the benchmark file or
    an image ``plans`` send differs from its manifest hash (edited since the build: a resumed run would mix the
    answers to two versions)."""
    from cxrground.percept.manifest import read_manifest

    root = bench.root
    if root is None:
        return
    listed = read_manifest(root)
    sent = {rel for p in plans for q in p.questions for rel in q.images}
    missing = sorted(rel for rel in sent | set(listed) if not (root / rel).is_file())
    if missing:
        raise InputError(f"incomplete benchmark: {len(missing)} file(s) it names are missing ({_listed(missing)}); "
                         "an unfinished or interrupted percept build? Finish it (rerun percept build) or check it "
                         "with percept validate", source)
    changed = sorted(rel for rel in sent | {BENCHMARK_FILE} if rel in listed and sha256_file(root / rel) != listed[rel])
    if changed:
        raise InputError(f"benchmark changed since it was built: {len(changed)} file(s) differ from "
                         f"MANIFEST.sha256 ({_listed(changed)}); rebuild it with percept build, or check it with "
                         "percept validate", source)


def _config_hash(cfg: dict[str, Any]) -> str:
    return sha256_json(cfg)


def _read_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; anything else is an :class:`InputError` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a JSON object ({exc})", path) from None
    if not isinstance(data, dict):
        raise InputError("not a JSON object", path)
    return data


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


_THINK_BLOCK: Final = re.compile(r"<think>.*?</think>", re.S)


def _blank(content: Any) -> bool:
    """Whether a reply holds no answer text (null, white space, or reasoning only: ``<think>`` blocks, also one left
    open): scored as unparseable where it came, never cached, so a later run asks again."""
    if not isinstance(content, str):
        return True
    rest = _THINK_BLOCK.sub("", content).strip()
    return not rest or rest.startswith("<think>")


#: The finish_reason of an answer cut at max_tokens.
CUT: Final[str] = "length"


def cut_reason(max_tokens: Any) -> str:
    """How a question whose answer the server cut at ``max_tokens`` is recorded (its ``error``)."""
    return f"answer cut at max_tokens={max_tokens} (finish_reason=length): raise --max-tokens"


def _usable(content: Any, finish_reason: Any) -> bool:
    """Whether a reply may be cached and taken from the cache: answer text, not cut at max_tokens."""
    return not _blank(content) and finish_reason != CUT


@dataclass(frozen=True)
class _ClientName:
    """``client``'s name in errors: its registry prefix and model (``openai:gpt-4o``)."""

    client: Any

    @property
    def name(self) -> str:
        try:  # a client whose kind or model itself fails is named by its class
            kind = str(getattr(self.client, "kind", "") or type(self.client).__name__)
            model = getattr(self.client, "model", None)
        except Exception:
            return type(self.client).__name__
        return f"{kind}:{model}" if model else kind


#: Seconds a client's ``complete()`` gets beyond the request timeout, so that a built-in HTTP client reports its
#: own timeout first.
TIMEOUT_GRACE_S: Final[float] = 5.0


class _CheckedClient:
    """``client`` as the runner uses it: its ``identity``, ``cache_context()``, ``kind``, ``model``, ``decoding``
    and ``max_images`` read under :func:`~cxrground.registry.backend_errors` naming it, and its ``complete()``
    bounded by ``timeout`` (plus :data:`TIMEOUT_GRACE_S`): past it, a
    :class:`~cxrground.llm.TransientError` naming the client (retried as the retry policy says)."""

    #: The attributes read under its name, with the type each must have and how an error words it.
    _ATTRS: Final[dict[str, tuple[type, str]]] = {"identity": (dict, "a dict"), "kind": (str, "text"),
                                                  "model": (object, "a model name"), "decoding": (dict, "a dict"),
                                                  "max_images": (int, "an integer")}

    def __init__(self, client: Any, timeout: float) -> None:
        self.inner, self.timeout = client, timeout

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet
            raise AttributeError(attr)
        if attr not in self._ATTRS:
            return getattr(self.inner, attr)
        with backend_errors("VLM client", _ClientName(self.inner), attr):
            value = getattr(self.inner, attr)
        return check_returned("VLM client", _ClientName(self.inner), attr, value, *self._ATTRS[attr])

    def cache_context(self, question: Question, case_id: str) -> dict[str, Any] | None:
        """The client's ``cache_context()``, its own errors named."""
        with backend_errors("VLM client", _ClientName(self.inner), "cache_context"):
            return self.inner.cache_context(question, case_id)  # type: ignore[no-any-return]

    async def complete(self, messages: Any, question: Question, case_id: str = "", seed: int | None = None) -> Any:
        """The client's ``complete()``, bounded by the timeout."""
        try:
            return await asyncio.wait_for(self.inner.complete(messages, question, case_id, seed),
                                          self.timeout + TIMEOUT_GRACE_S)
        except TimeoutError:
            raise TimedOut(f"{backend_label('VLM client', _ClientName(self.inner))} gave no answer within "
                           f"{self.timeout:g} s (the request timeout, --timeout)") from None


class _Runner:
    def __init__(self, client: Client, cache: PerceptCache, oracle: str, image_url: Callable[[str], str],
                 retry: RetryPolicy, out: Path, seed: int = 0, repeats: int = 1, usage: _Usage | None = None,
                 concurrency: int = 1, note: Callable[[str], None] | None = None,
                 cache_endpoint: bool = True) -> None:
        self.client = client
        self.usage = usage
        self.usage_file = out / USAGE_FILE
        self.cache = cache
        self.oracle = oracle
        self.image_url = image_url
        self.retry = retry
        self.seed = seed
        self.repeats = repeats
        self.results = out / RESULTS_FILE
        self.stats = _Stats()
        self._jitter = random.Random()
        #: Whether a request of this run got an answer from the model (a cache hit does not count).
        self._reached = False
        where = getattr(client, "base_url", None) or "the model server"
        #: Cases in a row whose request got no answer (the stop rule shared with the LLM structurer).
        self.no_answer = NoAnswerRun(concurrency, "the run stops", "cases", where, url_hint="--base-url")
        #: Requests in flight: ``concurrency`` at first, halved by a 429 (the retry notes say so).
        self.limit = AdaptiveLimit(concurrency)
        self.notes = RetryNotes("percept eval", limit=self.limit)
        self.cache_endpoint = cache_endpoint
        self.notes.on_note = note
        self.sampling = float(client.decoding.get("temperature", 0.0) or 0.0) > 0

    def _answered(self) -> bool:
        """Whether the server has answered any request (the client's own account when it keeps one)."""
        answered = getattr(self.client, "answered", None)
        return bool(answered) if isinstance(answered, bool) else self._reached

    async def _cached(self, key: str) -> dict[str, Any] | None:
        """The usable cached response of ``key``, or None: a row that does not read as a response record is a miss
        (counted, asked again and overwritten), and so is a reply without answer text or cut at max_tokens."""
        try:
            hit = await asyncio.to_thread(self.cache.get, key)
        except ValueError:
            self.stats.cache_corrupt += 1
            return None
        if hit is None or not _usable(hit.get("content"), hit.get("finish_reason")):
            return None  # an empty or cut reply stored by an earlier version: asked again
        return hit

    async def ask(self, messages: list[dict[str, Any]], q: Question, case_id: str, sample: int = 0
                  ) -> tuple[Completion, bool, int]:
        """(completion, from cache, attempts) for one request of sample ``sample``; the answer is the completion's
        ``raw`` (a reasoning the server split off as a ``<think>`` block)."""
        c = self.client
        seed = sample_seed(self.seed, sample)
        decoding = {**c.decoding, "seed": seed} if self.sampling else dict(c.decoding)
        context = c.cache_context(q, case_id)
        identity = cache_identity(c, self.cache_endpoint)
        key = percept_cache_key(identity, decoding, messages, sample, context)
        hit = await self._cached(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return Completion(hit.get("content"), hit.get("usage") or {}, hit.get("model_version")), True, 0

        async def attempt() -> Completion:
            self.stats.requests += 1
            with backend_errors("VLM client", _ClientName(c), "complete"):  # TransientError etc. pass unchanged
                got = await c.complete(messages, q, case_id, seed)
            return check_returned("VLM client", _ClientName(c), "complete", got, Completion, "Completion")

        retried: list[bool] = []

        def on_retry(exc: Any, wait: float) -> None:
            self.stats.retries += 1
            self.notes.retried(exc, wait, retried)

        try:
            completion, attempts = await call_with_retries(attempt, self.retry, rng=self._jitter, on_retry=on_retry,
                                                           limit=self.limit)
        finally:
            self.notes.done(retried)
        self._reached = True
        self.no_answer.answered()
        if completion.model_version:
            self.stats.model_versions.add(completion.model_version)
        for k in _TOKEN_KEYS:
            self.stats.tokens_sent[k] += int((completion.usage or {}).get(k, 0) or 0)
        raw = completion.raw
        if completion.finish_reason == CUT:
            self.stats.cut_answers += 1
        elif _blank(raw):
            self.stats.empty_replies += 1
            self.stats.tool_call_replies += completion.tool_calls > 0
        self._save_usage()  # each answer's request and tokens, durable before its case ends
        if _usable(raw, completion.finish_reason):  # an empty or cut reply: scored, never reused
            # off the event loop: a WAL commit waits for the disk
            await asyncio.to_thread(self.cache.put, key, identity, decoding, sample, messages, context,
                                    {"content": raw, "usage": completion.usage,
                                     "model_version": completion.model_version,
                                     "finish_reason": completion.finish_reason})
        return completion, False, attempts

    async def run_case(self, plan: CasePlan, sample: int = 0) -> dict[str, Any]:
        """Run one conversation (sample ``sample``) and append its result line."""
        started = time.perf_counter()
        conv = Conversation(plan, self.oracle, self.image_url)
        meta: list[dict[str, Any]] = []
        error = None
        no_answer = False
        try:
            while not conv.done:
                q = conv.current
                messages = conv.next_request()
                n_images = sum(1 for m in messages if isinstance(m["content"], list)
                               for p in m["content"] if p.get("type") == "image_url")
                if n_images > self.client.max_images:
                    raise ConfigError(f"request needs {n_images} images, the model accepts {self.client.max_images}")
                t0 = time.perf_counter()
                completion, cached, attempts = await self.ask(messages, q, plan.case_id, sample)
                timing = {"usage": completion.usage, "model_version": completion.model_version,
                          "cached": cached, "attempts": attempts, "latency_s": round(time.perf_counter() - t0, 4)}
                if completion.finish_reason == CUT:
                    meta.append({**record_cut(conv, completion.raw, self.client.decoding.get("max_tokens")),
                                 **timing})
                else:
                    meta.append({**record_answer(conv, completion.raw), **timing})
                    if completion.tool_calls and _blank(completion.raw):
                        meta[-1]["tool_calls"] = completion.tool_calls
        except ConfigError:
            raise
        except WaitTooLong as exc:  # a quota used up: every case would wait alike
            raise BatchStopped(f"the run stops: {exc.stop_line('--max-retry-after')}") from None
        except EndpointRefused as exc:  # the key, URL or model name, a redirect: every case would fail alike
            raise BatchStopped(f"the run stops: {exc.reason}") from None
        except ClientError as exc:  # retries spent: the server died or hangs, or this request failed
            stop = self.no_answer.failed(exc, self._answered())
            if stop is not None:
                raise BatchStopped(stop) from None
            no_answer = got_no_answer(exc)
            error = f"{type(exc).__name__}: {exc.reason}"
            self.stats.failed_cases += 1
            self.stats.no_answer_cases += no_answer
        except (CXRGroundError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
            self.stats.failed_cases += 1
        record = case_record(plan, conv, meta, error, time.perf_counter() - started)
        if no_answer:
            record["no_answer"] = True  # the server gave no answer: a rerun runs the case again
        if self.repeats > 1:
            record["repeat"] = sample
        with self.results.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        if self.usage is not None:
            self.usage.update((plan.case_id, sample), record)
        self._save_usage()
        return record

    def _save_usage(self) -> None:
        """Rewrite ``usage.json`` (atomically) with the counts so far: a kill loses only requests still in flight."""
        if self.usage is not None:
            _write_json(self.usage_file, self.usage.summary(self.stats))


def record_answer(conv: Conversation, content: str | None) -> dict[str, Any]:
    """Parse ``content`` as the answer to the current turn of ``conv`` (§14), record it in ``conv``; returns the
    turn's parse record (``numbers``, ``label``, ``matched``, ``correct_lenient``). Correctness is the reference
    scorer's on the canonical numbers (:func:`~.parsing.is_correct`): an ``unparseable`` answer (nothing
    extracted) is always wrong."""
    q = conv.current
    parsed = parse_answer(content, q.options, q.multi)
    conv.record(content, is_correct(parsed.numbers, q.gt, q.multi))
    return {"numbers": list(parsed.numbers), "label": parsed.label,
            "matched": list(parsed.matched) if parsed.matched else None,
            "correct_lenient": is_correct(parsed.effective, q.gt, q.multi)}


def record_cut(conv: Conversation, content: str | None, max_tokens: Any) -> dict[str, Any]:
    """Record an answer the server cut at ``max_tokens`` (finish_reason ``length``) as the current turn of ``conv``:
    not scored as the model's answer but as a failed question (wrong, label ``failed``) with the reason in
    ``error``; the conversation goes on as after a wrong answer."""
    conv.record(content, False)
    return {"numbers": [], "label": "failed", "matched": None, "correct_lenient": False,
            "finish_reason": CUT, "error": cut_reason(max_tokens)}


def case_record(plan: CasePlan, conv: Conversation, meta: list[dict[str, Any]], error: str | None,
                latency: float) -> dict[str, Any]:
    """The ``results.jsonl`` line of one conversation: every planned question (unanswered ones as ``failed``),
    token usage, status. ``meta``: per answered turn, :func:`record_answer`'s record plus usage and timing."""
    questions = []
    for k, q in enumerate(plan.questions):
        base = {"qid": q.qid, "stage": q.stage, "gt": list(q.gt), "multi": q.multi, "n_options": q.n_options}
        if k < len(conv.turns):
            t = conv.turns[k]
            base.update({"raw": t.raw, "correct": t.correct, "oracle_prefix": t.oracle_prefix,
                         "history_text": t.history_text if t.replaced else None, **meta[k]})
        else:
            base.update({"raw": None, "numbers": [], "label": "failed", "matched": None, "correct": False,
                         "correct_lenient": False, "oracle_prefix": None, "history_text": None,
                         "usage": {}, "cached": False, "attempts": 0, "latency_s": None})
        questions.append(base)
    usage: dict[str, int] = {}
    for m in meta:
        for k2, v in m["usage"].items():
            usage[k2] = usage.get(k2, 0) + int(v)
    return {"case_id": plan.case_id, "path": plan.path, "lesion": plan.lesion,
            "status": "failed" if error else "ok", "error": error, "questions": questions,
            "usage": usage, "latency_s": round(latency, 4)}


def _record_tokens(rec: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """(all tokens, tokens of requests not served from the cache) of one result record."""
    totals = dict.fromkeys(_TOKEN_KEYS, 0)
    new = dict.fromkeys(_TOKEN_KEYS, 0)
    for q in rec["questions"]:
        for k in _TOKEN_KEYS:
            v = int((q.get("usage") or {}).get(k, 0))
            totals[k] += v
            if not q.get("cached"):
                new[k] += v
    return totals, new


class _Usage:
    """The token totals of the run folder's results (last record per unit), kept up to date per finished case,
    and the request counters of earlier sessions (``previous``, the ``usage.json`` found at the start)."""

    def __init__(self, records: dict[tuple[str, int], dict[str, Any]], client: Client, previous: dict[str, Any],
                 prices: dict[str, Price] | None, prices_file: str | None) -> None:
        self.client, self.previous, self.prices, self.prices_file = client, previous, prices, prices_file
        self.tokens: dict[tuple[str, int], tuple[dict[str, int], dict[str, int]]] = {}
        self.totals = dict.fromkeys(_TOKEN_KEYS, 0)  # running sums over ``tokens`` (a summary per case stays O(1))
        self.new = dict.fromkeys(_TOKEN_KEYS, 0)
        for unit, rec in records.items():
            self.update(unit, rec)

    def update(self, unit: tuple[str, int], rec: dict[str, Any]) -> None:
        """Count the tokens of ``unit``'s record ``rec`` (in place of its earlier record's)."""
        (total, new), old = _record_tokens(rec), self.tokens.get(unit)
        for k in _TOKEN_KEYS:
            self.totals[k] += total[k] - (old[0][k] if old else 0)
            self.new[k] += new[k] - (old[1][k] if old else 0)
        self.tokens[unit] = (total, new)

    def summary(self, stats: _Stats) -> dict[str, Any]:
        return _usage_summary(dict(self.totals), dict(self.new), self.client, stats, self.previous, self.prices,
                              self.prices_file)


#: Counters of ``usage.json`` (every session into the folder) and the :class:`_Stats` field of each.
_REPLY_COUNTS: Final[dict[str, str]] = {"answers_cut": "cut_answers", "empty_replies": "empty_replies",
                                        "tool_call_replies": "tool_call_replies",
                                        "cache_rows_unreadable": "cache_corrupt"}


def _usage_summary(totals: dict[str, int], new: dict[str, int], client: Client, stats: _Stats,
                   previous: dict[str, Any], prices: dict[str, Price] | None = None,
                   prices_file: str | None = None) -> dict[str, Any]:
    price = price_of(client.model, PRICES if prices is None else prices)
    versions = sorted(set(previous.get("model_versions", [])) | stats.model_versions)
    earlier = previous.get("tokens_sent") if isinstance(previous.get("tokens_sent"), dict) else {}
    # a folder whose earlier sessions sent requests but counted no tokens (an older version): unknown, not zero
    unknown = not earlier and int(previous.get("requests_sent", 0) or 0) > 0
    sent = None if unknown else {k: int(earlier.get(k, 0) or 0) + stats.tokens_sent[k] for k in _TOKEN_KEYS}
    return {
        "model": client.model, "kind": client.kind, "model_versions": versions,
        "decoding": json.loads(json.dumps(client.decoding, default=str)),
        "tokens": totals, "tokens_uncached": new, "tokens_sent": sent,
        "requests_sent": int(previous.get("requests_sent", 0)) + stats.requests,
        "cache_hits": int(previous.get("cache_hits", 0)) + stats.cache_hits,
        "retries": int(previous.get("retries", 0)) + stats.retries,
        **{name: int(previous.get(name, 0) or 0) + getattr(stats, attr) for name, attr in _REPLY_COUNTS.items()},
        "price_usd_per_mtok": price._asdict() if price else None,
        "prices_file": prices_file,
        "cost_usd": round(cost_usd(price, totals), 6) if price else None,
        "cost_usd_uncached": round(cost_usd(price, new), 6) if price else None,
        "cost_usd_sent": round(cost_usd(price, sent), 6) if price and sent is not None else None,
    }


@locks_output("percept eval", "out")
def run_eval(settings: EvalSettings, out: Path, *, concurrency: int = 8, cache: str | Path | None = None,
             retry: RetryPolicy | None = None, base_url: str | None = None, api_key_env: str | None = None,
             retry_failed: bool = False, progress: bool = True, client: Client | None = None,
             prices: str | Path | None = None, note: Callable[[str], None] | None = None,
             cache_endpoint: bool = True) -> dict[str, Any]:
    """Run (or resume) an evaluation into ``out``; returns ``usage.json``'s content plus ``n_run``.

    ``cache_endpoint``: whether response cache keys hold the client's endpoint (``base_url``); False keys them by
    the model without it, so the same model served at another URL reuses the cached answers (only where one model
    name means one set of weights on every server).

    ``note`` gets the retry notes (at most one every 10 s while requests wait between attempts). A server that stops
    answering stops the run with a :class:`~cxrground.errors.BatchStopped` saying how many cases are answered and
    that rerunning the same command resumes.

    ``prices``: a price file (:func:`~.prices.load_prices`) merged over the built-in table for the cost in
    ``usage.json`` (read before anything runs, so that a bad file fails first).
    """
    if settings.oracle not in ORACLE_SETTINGS:
        raise ConfigError(f"--oracle must be one of {', '.join(ORACLE_SETTINGS)}, got {settings.oracle!r}")
    if concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {concurrency}")
    if settings.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {settings.repeats}")
    for name, value in (("--limit", settings.limit), ("--per-path-limit", settings.per_path_limit),
                        ("--max-tokens", settings.max_tokens), ("--max-images", settings.max_images)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if settings.extra_body and client is not None:
        raise ConfigError("with a ready client, give the extra body to the client (make_client(..., extra_body=...))")
    if settings.extra_body and settings.model.partition(":")[0] != "openai":
        raise ConfigError(f"--extra-body is sent to OpenAI-compatible servers only (openai:MODEL), not to "
                          f"{settings.model}")
    table = price_table(prices)
    retry = retry or RetryPolicy()
    bench = load_benchmark(settings.bench)
    every = plan_benchmark(bench, _bench_file(settings.bench))
    check_case_files(bench, every, _bench_file(settings.bench))
    position = {key: i for i, key in enumerate(bench.cases)}
    every = sorted(every, key=lambda p: position[p.case_id])  # benchmark file order, as the reference reads it
    plans = select_cases(every, settings.seed, settings.limit, settings.per_path_limit, settings.selection)
    if client is None:
        client = make_client(settings.model, base_url=base_url, api_key_env=api_key_env,
                             temperature=settings.temperature, max_tokens=settings.max_tokens, top_p=settings.top_p,
                             seed=settings.seed, max_images=settings.max_images, timeout=retry.timeout,
                             concurrency=concurrency, extra_body=settings.extra_body,
                             sampling_params=settings.sampling_params)
    client = cast(Client, _CheckedClient(client, retry.timeout))
    check_oracle = getattr(client, "check_oracle", None)
    if check_oracle is not None:  # a replayed file made under another oracle setting (replay:)
        check_oracle(settings.oracle)
    needed = max((p.total_images for p in plans), default=0)
    if client.max_images < needed:
        raise ConfigError(f"{settings.model} is configured for at most {client.max_images} images per request; "
                          f"this benchmark needs {needed} (§13.2: models must accept 7)")
    out = Path(out)
    cache_path = Path(cache) if cache is not None else out.resolve().parent / CACHE_FILE
    bench_root = _bench_file(settings.bench).parent
    check_outside_benchmark(bench_root, out, "--out")
    check_outside_benchmark(bench_root, cache_path, "the response cache" if cache is None else "--cache")
    store = PerceptCache(cache_path)  # first: a file that is no cache is refused before the run folder is made
    try:
        return _run_into(settings, out, store, client, plans, bench, concurrency, retry, retry_failed, progress,
                         table, prices, note, cache_endpoint)
    finally:
        store.close()


def _run_into(settings: EvalSettings, out: Path, store: PerceptCache, client: Client, plans: list[CasePlan],
              bench: Benchmark, concurrency: int, retry: RetryPolicy, retry_failed: bool, progress: bool,
              table: dict[str, Price], prices: str | Path | None,
              note: Callable[[str], None] | None = None, cache_endpoint: bool = True) -> dict[str, Any]:
    """:func:`run_eval` once its inputs are checked and the cache is open."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(settings, client, len(plans))
    digest = _config_hash(cfg)
    cfg_file = out / CONFIG_FILE
    if cfg_file.is_file():
        old = _read_object(cfg_file)
        if not isinstance(old.get("config"), dict):
            raise InputError('not a run configuration: expected {"config": {...}}; use another --out', cfg_file)
        if old.get("config_sha256") != digest:
            then, now = flat_json(old.get("config", {})), flat_json(json.loads(json.dumps(cfg)))
            changed = [f"{k} {then.get(k, 'unset')} then, {now.get(k, 'unset')} now"
                       for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)]
            raise ConfigError(f"{out} holds a run with a different configuration (changed: "
                              f"{'; '.join(changed[:6])}{f'; and {len(changed) - 6} more' if len(changed) > 6 else ''}"
                              "); use another --out")
    _write_json(cfg_file, {"config": cfg, "config_sha256": digest})
    _write_json(out / CASES_FILE, [p.summary() for p in plans])
    _repair_tail(out / RESULTS_FILE)
    done = load_all_results(out)
    units = [(p, k) for k in range(settings.repeats) for p in plans]
    todo = [(p, k) for p, k in units if (p.case_id, k) not in done or _run_again(done[p.case_id, k], retry_failed)]
    root = bench.root
    assert root is not None

    def image_url(rel: str) -> str:
        return image_data_url(safe_image_path(root, rel))  # checked at plan time; again in case a link changed

    usage_file = out / USAGE_FILE
    previous = _read_object(usage_file) if usage_file.is_file() else {}
    usage = _Usage(done, client, previous, table, str(prices) if prices is not None else None)
    runner = _Runner(client, store, settings.oracle, image_url, retry, out, settings.seed, settings.repeats,
                     usage, concurrency, note, cache_endpoint)
    try:
        run_sync(_run_all(runner, todo, concurrency, progress))
    except BatchStopped as exc:
        final = load_all_results(out)
        answered = sum(1 for p, k in units if final.get((p.case_id, k), {}).get("status") == "ok")
        raise BatchStopped(f"{exc}. {answered} of {len(units)} cases are answered and kept in {out}; rerun the same "
                           "command to resume (the cases the server gave no answer to run again)") from None
    final = load_all_results(out)
    summary = _Usage(final, client, previous, table, str(prices) if prices is not None else None).summary(runner.stats)
    _write_json(usage_file, summary)
    failed_units = sum(1 for p, k in units if final.get((p.case_id, k), {}).get("status") == "failed")
    return {**summary, "n_run": len(todo), "n_cases": len(plans), "repeats": settings.repeats,
            "n_units": len(units), "failed_units": failed_units,
            "failed_this_run": runner.stats.failed_cases, "sent_this_run": runner.stats.requests,
            "no_answer_this_run": runner.stats.no_answer_cases, "cut_this_run": runner.stats.cut_answers,
            "empty_this_run": runner.stats.empty_replies, "tool_calls_this_run": runner.stats.tool_call_replies,
            "cache_corrupt_this_run": runner.stats.cache_corrupt,
            "cache_hits_this_run": runner.stats.cache_hits, "retries_this_run": runner.stats.retries}


def _run_again(rec: dict[str, Any], retry_failed: bool) -> bool:
    """Whether a recorded unit runs again: a failed case with ``retry_failed``, or one the server gave no answer to
    (a transport failure, not a result of the model)."""
    return rec.get("status") == "failed" and (retry_failed or rec.get("no_answer") is True)


async def _run_all(runner: _Runner, todo: list[tuple[CasePlan, int]], concurrency: int, progress: bool) -> None:
    from cxrground.io.progress import progress_bar

    bar = progress_bar(total=len(todo), desc="percept eval", unit="case", progress=progress)

    async def one(unit: tuple[CasePlan, int]) -> dict[str, Any]:
        return await runner.run_case(*unit)

    try:
        await bounded_map(one, todo, concurrency, lambda _: bar.update(1))
    finally:
        bar.close()
        await runner.client.aclose()


def run_summary_line(summary: dict[str, Any], repeats: int, out: str | Path) -> str:
    """One line about a :func:`run_eval` summary: cases run and failed, requests sent and cache hits by this run
    (the run folder's totals over every run into it in brackets when they differ), run folder."""
    total = f"{summary['n_cases']} cases" if repeats == 1 else f"{summary['n_cases']} cases × {repeats} repeats"
    sent = summary.get("sent_this_run", summary["requests_sent"])
    hits = summary.get("cache_hits_this_run", summary["cache_hits"])
    earlier = ("" if (sent, hits) == (summary["requests_sent"], summary["cache_hits"]) else
               f" (this folder in all: {summary['requests_sent']} sent, {summary['cache_hits']} cache hits)")
    kept = summary.get("failed_units", 0) - summary["failed_this_run"]
    failed_before = f"; {kept} failed in an earlier run and kept (--retry-failed runs them again)" if kept > 0 else ""
    no_answer = summary.get("no_answer_this_run", 0)
    failed = f"{summary['failed_this_run']} failed" + (
        f", {no_answer} of them got no answer from the server: rerun to run them again" if no_answer else "")
    return (f"{summary['n_run']} of {total} run ({failed}){failed_before}, "
            f"{sent} requests sent, {hits} cache hits{earlier}{reply_notes(summary)} -> {out}")


def reply_notes(summary: dict[str, Any]) -> str:
    """``; N answers cut at max_tokens ...; N empty replies ...`` of a :func:`run_eval` summary ("" when none)."""
    parts = []
    if summary.get("cut_this_run"):
        parts.append(f"{summary['cut_this_run']} answers cut at max_tokens (recorded as failed questions: raise "
                     "--max-tokens)")
    if summary.get("empty_this_run"):
        calls = summary.get("tool_calls_this_run", 0)
        parts.append(f"{summary['empty_this_run']} empty replies (no answer text; scored unparseable"
                     + (f"; {calls} held tool calls only: check the server's tool parser" if calls else "") + ")")
    if summary.get("cache_corrupt_this_run"):
        parts.append(f"{summary['cache_corrupt_this_run']} unreadable cache rows asked again")
    return "".join(f"; {p}" for p in parts)
