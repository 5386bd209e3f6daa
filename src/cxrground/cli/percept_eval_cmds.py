"""``cxrground percept eval | score | report``: run VLMs on CheXpercept, score the runs, compare them in HTML.

The commands are added to the ``percept`` group (:mod:`cxrground.cli.percept_build_cmds`) at import time;
``COMMANDS`` is empty because the group is registered there. API keys come only from the environment
variable named by ``--api-key-env``; there is no option that takes a key.
"""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import DIR, EXISTING, OUT_DIR, OUT_FILE
from cxrground.cli.percept_build_cmds import percept
from cxrground.evaluation.percept.clients import spec_forms
from cxrground.llm import RetryPolicy, parse_extra_body


@percept.command("eval")
@click.option("--bench", type=EXISTING, required=True,
              help="Benchmark folder (chexpercept.json + images) or the JSON file.")
@click.option("--model", "spec", required=True, help=f"{spec_forms()}.")
@click.option("--out", type=OUT_DIR, required=True, help="Run folder.")
@click.option("--oracle", type=click.Choice(["none", "implicit", "explicit"]), default="implicit")
@click.option("--concurrency", type=int, default=8, help="Cases in flight at once.")
@click.option("--limit", type=int, default=None, help="Evaluate only N cases (deterministic selection).")
@click.option("--per-path-limit", type=int, default=None, help="At most N cases per path (RR/RF/LF).")
@click.option("--temperature", type=float, default=0.0)
@click.option("--top-p", type=float, default=None)
@click.option("--max-tokens", type=int, default=8192)
@click.option("--max-images", type=int, default=7,
              help="Images per request the model accepts (an RR conversation needs 7).")
@click.option("--base-url", default=None, help="API root of an OpenAI-compatible server (http://host:8000/v1).")
@click.option("--api-key-env", default=None, help="Name of the environment variable holding the API key.")
@click.option("--seed", type=int, default=0, help="Case selection, random baseline, bootstrap.")
@click.option("--cache", type=OUT_FILE, default=None,
              help="Response cache (SQLite); default: percept_cache.sqlite next to the run folder.")
@click.option("--timeout", type=float, default=RetryPolicy.timeout, help="Seconds per request.")
@click.option("--max-attempts", type=int, default=RetryPolicy.max_attempts, help="Attempts per request (retries + 1).")
@click.option("--repeats", type=click.IntRange(min=1), default=1,
              help="Samples per question at the run's temperature (score: mean and spread over repeats).")
@click.option("--extra-body", "extra_body", default=None, metavar="JSON",
              help='JSON object merged into every request of openai:MODEL (part of the cache key and config.json), '
                   'e.g. \'{"reasoning_effort": "medium"}\' or '
                   '\'{"chat_template_kwargs": {"enable_thinking": false}}\'; "max_tokens": null leaves max_tokens '
                   'out (for servers that take max_completion_tokens only).')
@click.option("--prices", type=OUT_FILE, default=None,
              help="Price table (CSV model,input,cached_input,output or JSON; USD per 1M tokens) merged over the "
                   "built-in one for the cost in usage.json.")
@click.option("--retry-failed", is_flag=True, help="Re-run cases recorded as failed.")
@click.option("--progress/--no-progress", default=True)
def eval_cmd(bench: Path, spec: str, out: Path, oracle: str, concurrency: int, limit: int | None,
             per_path_limit: int | None, temperature: float, top_p: float | None, max_tokens: int, max_images: int,
             base_url: str | None, api_key_env: str | None, seed: int, cache: Path | None, timeout: float,
             max_attempts: int, repeats: int, extra_body: str | None, prices: Path | None, retry_failed: bool,
             progress: bool) -> None:
    """Run one model on a benchmark (resumable: rerun the same command after a kill)."""
    from cxrground.evaluation.percept.runner import EvalSettings, run_eval, run_summary_line

    extra = parse_extra_body(extra_body) if extra_body is not None else None
    settings = EvalSettings(bench=bench, model=spec, oracle=oracle, temperature=temperature,
                            max_tokens=max_tokens, top_p=top_p, seed=seed, limit=limit,
                            per_path_limit=per_path_limit, max_images=max_images, repeats=repeats,
                            extra_body=extra)
    summary = run_eval(settings, out, concurrency=concurrency, cache=cache, base_url=base_url,
                       api_key_env=api_key_env, retry=RetryPolicy(max_attempts=max_attempts, timeout=timeout),
                       retry_failed=retry_failed, progress=progress, prices=prices)
    click.echo(run_summary_line(summary, repeats, out))


@percept.command("score")
@click.argument("run", type=DIR)
@click.option("--bootstrap", "n_boot", type=int, default=1000, help="Bootstrap resamples (0 = none).")
def score_cmd(run: Path, n_boot: int) -> None:
    """Score a run: score.json and the reference CSVs in RUN/; prints the summary rows (and the spread rows of
    runs with several repeats)."""
    from cxrground.evaluation.percept.scoring import score_lines, score_run

    lines, note = score_lines(score_run(run, n_boot=n_boot))
    for line in lines:
        click.echo(line)
    if note:
        click.echo(note, err=True)


@percept.command("report")
@click.argument("runs", nargs=-1, required=True, type=DIR)
@click.option("--out", type=OUT_FILE, required=True, help="HTML file to write.")
@click.option("--bootstrap", "n_boot", type=int, default=1000)
def report_cmd(runs: tuple[Path, ...], out: Path, n_boot: int) -> None:
    """Compare runs in one self-contained HTML page (+ all_models_summary.csv next to it)."""
    from cxrground.evaluation.percept.report import build_report

    path = build_report(list(runs), out, n_boot=n_boot)
    click.echo(f"wrote {path}")

COMMANDS: list[click.Command] = []
