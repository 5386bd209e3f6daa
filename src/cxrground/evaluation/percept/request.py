"""One evaluation run as a request (:class:`EvalRequest`) and :func:`run_request`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground percept eval`` offers one option per
field. The request splits into the settings that determine the results
(:class:`~cxrground.evaluation.percept.runner.EvalSettings`) and how the run goes (concurrency, cache, retries,
server); the runner is imported when a run starts. API keys come only from the environment variable the request
names, never from a field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cxrground.evaluation.percept.clients import SAMPLING_PARAMS, spec_forms
from cxrground.fields import check_bounds, option
from cxrground.llm import RetryPolicy, parse_extra_body

__all__ = ["EvalOutcome", "EvalRequest", "evaluate_request", "run_request"]


@dataclass(frozen=True, kw_only=True)
class EvalRequest:
    """Everything one run of one model on a benchmark needs."""

    bench: Path = option(path="existing", help="Benchmark folder (chexpercept.json + images) or the JSON file.")
    spec: str = option(flag="--model", help=f"{spec_forms()}.")
    out: Path = option(path="out_dir", help="Run folder.")
    oracle: str = option("implicit", choices=("none", "implicit", "explicit"), help="After a wrong answer: go on "
                         "(none); replace the wrong answer by the ground truth in the conversation history "
                         "(implicit); or keep the model's answer and prepend the ground-truth text to the next "
                         "question (explicit). CHEXPERCEPT.md §13.3.")
    concurrency: int = option(8, low=1, help="Cases in flight at once (and requests, at most: each 429 of a rate "
                              "limit halves the requests allowed in flight, down to 1; a run of answers grows them "
                              "back by one up to this).")
    limit: int | None = option(None, help="Evaluate only N cases (deterministic selection, not balanced across "
                               "paths: a small N may hold one path only; --per-path-limit takes N of each path).")
    per_path_limit: int | None = option(None, help="At most N cases per path (RR/RF/LF).")
    selection: str = option("hash", choices=("hash", "reference"),
                            help="Which cases --limit / --per-path-limit keep: hash (the first in the order of a "
                            "hash of --seed and the case id) or reference (the first in benchmark file order, as the "
                            "reference evaluator's --limit / --per_path_limit: one of the two; to score or replay "
                            "the cases of a reference run).")
    temperature: float = option(0.0, low=0.0, help="Sampling temperature (0: greedy).")
    top_p: float | None = option(None, low=0.0, high=1.0, low_open=True,
                                 help="Nucleus sampling; default 1 when the sampling parameters are explicit, not "
                                 "sent when minimal.")
    sampling_params: str = option("auto", choices=SAMPLING_PARAMS,
                                  help="openai:/hf: explicit sends every sampling parameter at the reference's vLLM "
                                  "values (top_p 1, top_k off, min_p 0, repetition/presence/frequency penalties "
                                  "neutral), so no generation-config default of the server or model applies; "
                                  "minimal sends only temperature, the token limit and --top-p when given (hosted "
                                  "APIs: OpenAI refuses vLLM's top_k/min_p/repetition_penalty); auto: minimal for "
                                  "a hosted API's --base-url (OpenAI, Azure OpenAI, Gemini, ...), else explicit.")
    max_tokens: int = option(8192, low=1, help="Most tokens a reply may have (reasoning included).")
    max_images: int = option(7, low=1, help="Images per request the model accepts (an RR conversation needs 7).")
    base_url: str | None = option(None, help="API root of an OpenAI-compatible server (http://host:8000/v1).")
    api_key_env: str | None = option(None, help="Name of the environment variable holding the API key.")
    seed: int = option(0, low=0, help="Case selection, random baseline, bootstrap.")
    cache: Path | None = option(None, path="out_file",
                                help="Response cache (SQLite); default: percept_cache.sqlite next to the run folder.")
    cache_endpoint: bool = option(True, flag="--cache-endpoint/--no-cache-endpoint",
                                  help="Whether the response cache is keyed by the endpoint (--base-url) too; "
                                  "--no-cache-endpoint keys it by the model name alone, so the same model served at "
                                  "another URL reuses the cached answers (only where one model name means one set "
                                  "of weights on every server).")
    timeout: float = option(RetryPolicy.timeout, low=0.0, low_open=True, help="Seconds per request, for every "
                            "client: a request with no answer 5 s past it is a timeout, retried like one.")
    max_attempts: int = option(RetryPolicy.max_attempts, low=1, help="Attempts per request (retries + 1).")
    backoff: float = option(RetryPolicy.backoff, low=0.0, help="Seconds of the first retry's backoff step; it "
                            "doubles with each retry (with jitter: half to all of the step). A server's Retry-After "
                            "longer than the step is waited out instead; a shorter one never shortens it.")
    max_backoff: float = option(RetryPolicy.max_backoff, low=0.0, help="Most seconds of one backoff step.")
    max_retry_after: float = option(RetryPolicy.max_retry_after, low=0.0, help="Most seconds waited for a server's "
                                    "Retry-After; a longer one (a daily quota) stops the run, keeping what was done: "
                                    "rerun the same command to resume.")
    repeats: int = option(1, low=1, help="Samples per question at the run's temperature (score: mean and spread "
                          "over repeats).")
    extra_body: str | None = option(None, metavar="JSON", help='JSON object merged into every request of '
                                    'openai:MODEL (part of the cache key and config.json), e.g. '
                                    '\'{"reasoning_effort": "medium"}\' or \'{"chat_template_kwargs": '
                                    '{"enable_thinking": false}}\'; it overrides an explicit sampling value '
                                    '(\'{"repetition_penalty": 1.05}\'); null leaves max_tokens or an explicit '
                                    'sampling key out (\'{"max_completion_tokens": 8192, "max_tokens": null}\' for '
                                    'OpenAI reasoning models).')
    prices: Path | None = option(None, path="out_file", help="Price table (CSV model,input,cached_input,output or "
                                 "JSON; USD per 1M tokens) merged over the built-in one for the cost in usage.json.")
    retry_failed: bool = option(False, help="Re-run cases recorded as failed.")
    progress: bool = option(True, flag="--progress/--no-progress", help="A progress bar over the cases.")

    def __post_init__(self) -> None:
        """Refuse values outside their range (:class:`OptionValueError`, a usage error on the command line)."""
        check_bounds(self)


@dataclass(frozen=True)
class EvalOutcome:
    """How a run ended: its one-line summary, whether every case failed (this session's cases, or every case of the
    run folder), and how many units (case, repeat) of the run folder are recorded as failed."""

    line: str
    all_failed: bool
    failed_units: int


def run_request(request: EvalRequest) -> tuple[str, bool]:
    """Run (or resume) the evaluation into ``request.out``; returns the one-line summary of the run and whether
    this session ran cases and every one failed, or every case of the run folder is recorded as failed (an earlier
    session's failures, kept by a rerun without --retry-failed)."""
    outcome = evaluate_request(request)
    return outcome.line, outcome.all_failed


def evaluate_request(request: EvalRequest, note: Callable[[str], None] | None = None) -> EvalOutcome:
    """:func:`run_request` with the failed units counted; ``note`` gets the retry notes."""
    from cxrground.evaluation.percept.runner import EvalSettings, run_eval, run_summary_line

    r = request
    extra = parse_extra_body(r.extra_body) if r.extra_body is not None else None
    settings = EvalSettings(bench=r.bench, model=r.spec, oracle=r.oracle, temperature=r.temperature,
                            max_tokens=r.max_tokens, top_p=r.top_p, seed=r.seed, limit=r.limit,
                            per_path_limit=r.per_path_limit, selection=r.selection, max_images=r.max_images,
                            repeats=r.repeats, extra_body=extra, sampling_params=r.sampling_params)
    summary = run_eval(settings, r.out, concurrency=r.concurrency, cache=r.cache, base_url=r.base_url,
                       api_key_env=r.api_key_env, retry_failed=r.retry_failed, progress=r.progress, prices=r.prices,
                       cache_endpoint=r.cache_endpoint,
                       retry=RetryPolicy(max_attempts=r.max_attempts, timeout=r.timeout, backoff=r.backoff,
                                         max_backoff=r.max_backoff, max_retry_after=r.max_retry_after), note=note)
    all_failed = ((summary["n_run"] > 0 and summary["failed_this_run"] == summary["n_run"])
                  or (summary["n_units"] > 0 and summary["failed_units"] == summary["n_units"]))
    return EvalOutcome(run_summary_line(summary, r.repeats, r.out), all_failed, int(summary["failed_units"]))
