"""``percept eval``: run a model on a CheXpercept benchmark, concurrent across cases, cached and resumable.

- Cases run concurrently (asyncio; ``concurrency`` workers, one case each at a time), turns in order
  within a case (§13.2).
- Every request goes through the response cache (:mod:`.cache`; model clients only, baselines are not
  cached): rerunning, resuming or switching oracle setting never repeats an answered request. Default
  cache file: ``percept_cache.sqlite`` next to the RUN folder, so sibling runs share it.
- Transient errors (429, 5xx, timeouts, connection errors) are retried up to ``max_attempts`` attempts in
  all, waiting ``Retry-After`` when the server sends one (capped at ``max_retry_after``), else exponential
  backoff with jitter (attempt ``k`` waits between half and all of ``min(max_backoff, backoff * 2**k)``).
  A case that still fails is recorded with ``status: "failed"`` and the error; its unanswered questions are
  recorded with label ``failed`` and count as wrong.
- ``RUN/`` holds ``config.json`` (the settings that determine results and their SHA-256; a RUN made with a
  different configuration is refused), ``cases.json`` (the selected cases' plans without texts, the
  denominators of scoring), ``results.jsonl`` (append-only, one line per finished case) and ``usage.json``
  (tokens, request counts, model versions seen, cost when :mod:`.prices` has the model).
- Resume: cases already in ``results.jsonl`` are skipped (``retry_failed`` re-runs the failed ones; the
  last line of a case wins); a partially run case is re-run and its answered turns come from the cache.
  A torn last line (kill during a write) is cut off before appending.
- Selection (deterministic): cases ordered by SHA-256 of ``{seed}:{case_id}``; ``per_path_limit`` keeps the
  first N of each path in that order, then ``limit`` the first N overall.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, CXRGroundError
from cxrground.evaluation.percept.cache import PerceptCache, percept_cache_key
from cxrground.evaluation.percept.clients import Client, ClientError, Completion, TransientError, make_client
from cxrground.evaluation.percept.conversation import (
    ORACLE_SETTINGS,
    CasePlan,
    Conversation,
    Question,
    image_data_url,
    plan_benchmark,
)
from cxrground.evaluation.percept.parsing import is_correct, parse_answer
from cxrground.evaluation.percept.prices import cost_usd, price_of
from cxrground.percept.schema import BENCHMARK_FILE, load_benchmark
from cxrground.reports.structure.aio import run_sync

__all__ = ["CACHE_FILE", "EvalSettings", "RetryPolicy", "load_results", "run_eval", "select_cases"]

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


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient errors (see the module docstring)."""

    max_attempts: int = 6
    backoff: float = 1.0
    max_backoff: float = 60.0
    max_retry_after: float = 300.0
    timeout: float = 600.0


@dataclass
class _Stats:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failed_cases: int = 0
    model_versions: set[str] = field(default_factory=set)


def select_cases(plans: Sequence[CasePlan], seed: int, limit: int | None = None,
                 per_path_limit: int | None = None) -> list[CasePlan]:
    """The deterministic selection of the module docstring."""
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


def load_results(run: Path) -> dict[str, dict[str, Any]]:
    """Case id -> last result line of ``RUN/results.jsonl`` (a torn last line is ignored)."""
    path = Path(run) / RESULTS_FILE
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[rec["case_id"]] = rec
    return out


def _repair_tail(path: Path) -> None:
    """Cut a torn last line (no trailing newline) so that appends start on a fresh line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _config(settings: EvalSettings, client: Client, n_cases: int) -> dict[str, Any]:
    bench_file = Path(settings.bench)
    bench_file = bench_file / BENCHMARK_FILE if bench_file.is_dir() else bench_file
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    cfg["bench"] = str(bench_file.resolve().parent)
    cfg["bench_sha256"] = hashlib.sha256(bench_file.read_bytes()).hexdigest()
    cfg["client"] = {"kind": client.kind, "model": client.model, "decoding": client.decoding}
    cfg["n_cases"] = n_cases
    cfg["harness_version"] = HARNESS_VERSION
    return cfg


def _config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


class _Runner:
    def __init__(self, client: Client, cache: PerceptCache | None, oracle: str, image_url: Callable[[str], str],
                 retry: RetryPolicy, out: Path) -> None:
        self.client = client
        self.cache = cache
        self.oracle = oracle
        self.image_url = image_url
        self.retry = retry
        self.results = out / RESULTS_FILE
        self.stats = _Stats()
        self._jitter = random.Random()

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry.max_retry_after)
        full = min(self.retry.max_backoff, self.retry.backoff * 2.0**attempt)
        return self._jitter.uniform(full / 2, full)

    async def ask(self, messages: list[dict[str, Any]], q: Question, case_id: str
                  ) -> tuple[Completion, bool, int]:
        """(completion, from cache, attempts) for one request."""
        c = self.client
        use_cache = c.cacheable and self.cache is not None
        key = percept_cache_key(c.kind, c.model, c.decoding, messages) if use_cache else None
        if key is not None and self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                self.stats.cache_hits += 1
                return Completion(hit.get("content"), hit.get("usage") or {}, hit.get("model_version")), True, 0
        attempt = 0
        while True:
            try:
                self.stats.requests += 1
                completion = await c.complete(messages, q, case_id)
                break
            except TransientError as exc:
                attempt += 1
                if attempt >= self.retry.max_attempts:
                    raise ClientError(f"{exc.reason} (after {attempt} attempts)") from None
                self.stats.retries += 1
                await asyncio.sleep(self._delay(attempt - 1, exc.retry_after))
        if completion.model_version:
            self.stats.model_versions.add(completion.model_version)
        if key is not None and self.cache is not None:
            # off the event loop: a WAL commit waits for the disk
            await asyncio.to_thread(self.cache.put, key, c.kind, c.model, c.decoding, messages,
                                    {"content": completion.content, "usage": completion.usage,
                                     "model_version": completion.model_version})
        return completion, False, attempt + 1

    async def run_case(self, plan: CasePlan) -> dict[str, Any]:
        """Run one conversation and append its result line."""
        started = time.perf_counter()
        conv = Conversation(plan, self.oracle, self.image_url)
        meta: list[dict[str, Any]] = []
        error = None
        try:
            while not conv.done:
                q = conv.current
                messages = conv.next_request()
                n_images = sum(1 for m in messages if isinstance(m["content"], list)
                               for p in m["content"] if p.get("type") == "image_url")
                if n_images > self.client.max_images:
                    raise ConfigError(f"request needs {n_images} images, the model accepts {self.client.max_images}")
                t0 = time.perf_counter()
                completion, cached, attempts = await self.ask(messages, q, plan.case_id)
                parsed = parse_answer(completion.content, q.options, q.multi)
                correct = is_correct(parsed.numbers, q.gt, q.multi)
                conv.record(completion.content, correct)
                meta.append({"numbers": list(parsed.numbers), "label": parsed.label,
                             "matched": list(parsed.matched) if parsed.matched else None,
                             "correct_lenient": is_correct(parsed.effective, q.gt, q.multi),
                             "usage": completion.usage, "model_version": completion.model_version,
                             "cached": cached, "attempts": attempts,
                             "latency_s": round(time.perf_counter() - t0, 4)})
        except ConfigError:
            raise
        except (CXRGroundError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
            self.stats.failed_cases += 1
        record = self._record(plan, conv, meta, error, time.perf_counter() - started)
        with self.results.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    @staticmethod
    def _record(plan: CasePlan, conv: Conversation, meta: list[dict[str, Any]], error: str | None,
                latency: float) -> dict[str, Any]:
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


def _usage_summary(results: dict[str, dict[str, Any]], client: Client, stats: _Stats,
                   previous: dict[str, Any]) -> dict[str, Any]:
    totals = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    new = dict.fromkeys(totals, 0)
    for rec in results.values():
        for q in rec["questions"]:
            for k in totals:
                v = int((q.get("usage") or {}).get(k, 0))
                totals[k] += v
                if not q.get("cached"):
                    new[k] += v
    price = price_of(client.model)
    versions = sorted(set(previous.get("model_versions", [])) | stats.model_versions)
    return {
        "model": client.model, "kind": client.kind, "model_versions": versions,
        "tokens": totals, "tokens_uncached": new,
        "requests_sent": int(previous.get("requests_sent", 0)) + stats.requests,
        "cache_hits": int(previous.get("cache_hits", 0)) + stats.cache_hits,
        "retries": int(previous.get("retries", 0)) + stats.retries,
        "price_usd_per_mtok": price._asdict() if price else None,
        "cost_usd": round(cost_usd(price, totals), 6) if price else None,
        "cost_usd_uncached": round(cost_usd(price, new), 6) if price else None,
    }


def run_eval(settings: EvalSettings, out: Path, *, concurrency: int = 8, cache: str | Path | None = None,
             retry: RetryPolicy | None = None, base_url: str | None = None, api_key_env: str | None = None,
             retry_failed: bool = False, progress: bool = True, client: Client | None = None,
             ) -> dict[str, Any]:
    """Run (or resume) an evaluation into ``out``; returns ``usage.json``'s content plus ``n_run``."""
    if settings.oracle not in ORACLE_SETTINGS:
        raise ConfigError(f"--oracle must be one of {', '.join(ORACLE_SETTINGS)}, got {settings.oracle!r}")
    if concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {concurrency}")
    retry = retry or RetryPolicy()
    bench = load_benchmark(settings.bench)
    plans = select_cases(plan_benchmark(bench), settings.seed, settings.limit, settings.per_path_limit)
    if client is None:
        client = make_client(settings.model, base_url=base_url, api_key_env=api_key_env,
                             temperature=settings.temperature, max_tokens=settings.max_tokens, top_p=settings.top_p,
                             seed=settings.seed, max_images=settings.max_images, timeout=retry.timeout,
                             concurrency=concurrency)
    needed = max((p.total_images for p in plans), default=0)
    if client.max_images < needed:
        raise ConfigError(f"{settings.model} is configured for at most {client.max_images} images per request; "
                          f"this benchmark needs {needed} (§13.2: models must accept 7)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(settings, client, len(plans))
    digest = _config_hash(cfg)
    cfg_file = out / CONFIG_FILE
    if cfg_file.is_file():
        old = json.loads(cfg_file.read_text(encoding="utf-8"))
        if old.get("config_sha256") != digest:
            changed = sorted(k for k in set(cfg) | set(old.get("config", {}))
                             if cfg.get(k) != old.get("config", {}).get(k))
            raise ConfigError(f"{out} holds a run with a different configuration (changed: {', '.join(changed)}); "
                              "use another --out")
    _write_json(cfg_file, {"config": cfg, "config_sha256": digest})
    _write_json(out / CASES_FILE, [p.summary() for p in plans])
    _repair_tail(out / RESULTS_FILE)
    done = load_results(out)
    todo = [p for p in plans if p.case_id not in done or (retry_failed and done[p.case_id]["status"] == "failed")]
    cache_path = Path(cache) if cache is not None else out.resolve().parent / CACHE_FILE
    store = PerceptCache(cache_path) if client.cacheable else None
    root = bench.root
    assert root is not None

    def image_url(rel: str) -> str:
        return image_data_url(root / rel)

    runner = _Runner(client, store, settings.oracle, image_url, retry, out)
    try:
        run_sync(_run_all(runner, todo, concurrency, progress))
    finally:
        if store is not None:
            store.close()
    usage_file = out / USAGE_FILE
    previous = json.loads(usage_file.read_text(encoding="utf-8")) if usage_file.is_file() else {}
    summary = _usage_summary(load_results(out), client, runner.stats, previous)
    _write_json(usage_file, summary)
    return {**summary, "n_run": len(todo), "n_cases": len(plans), "failed_this_run": runner.stats.failed_cases}


async def _run_all(runner: _Runner, todo: list[CasePlan], concurrency: int, progress: bool) -> None:
    from tqdm.auto import tqdm

    queue = iter(todo)
    bar = tqdm(total=len(todo), desc="percept eval", unit="case", disable=not progress)

    async def worker() -> None:
        for plan in queue:
            await runner.run_case(plan)
            bar.update(1)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(1, len(todo))))))
    finally:
        bar.close()
        await runner.client.aclose()
