"""``cxrground reports structure`` (attached to the ``reports`` group): findings (ILS §7) as JSON lines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cxrground.cli.common import EXISTING, OUT_FILE
from cxrground.errors import ConfigError
from cxrground.llm import RetryPolicy
from cxrground.reports import DEFAULT_SECTION_POLICY, SECTION_POLICIES, expand_report_paths, read_reports
from cxrground.reports.findings import finding_output
from cxrground.reports.structure import (
    ALTERNATIVE_POLICIES,
    STRUCTURERS,
    get_structurer,
    structure_reports,
    structurer_options,
)

from .report_cmds import reports

__all__ = ["COMMANDS", "structure"]


@reports.command("structure")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@click.option("--structurer", "structurer_name", type=click.Choice(sorted(STRUCTURERS)), default="rules",
              help="Rule-based (built in) or an LLM behind an OpenAI-compatible API.")
@click.option("--sections", type=click.Choice(SECTION_POLICIES), default=DEFAULT_SECTION_POLICY,
              help="Report section policy: findings (ILS §6), impression, or findings+impression (both, numbered on).")
@click.option("--alternatives", type=click.Choice(ALTERNATIVE_POLICIES), default=None,
              help="Rule structurer: alternatives ('atelectasis or scarring') uncertain (default) or present.")
@click.option("--base-url", envvar="CXRGROUND_LLM_BASE_URL", help="API root, e.g. http://localhost:8000/v1 (llm).")
@click.option("--model", envvar="CXRGROUND_LLM_MODEL", help="Model name sent to the API (llm).")
@click.option("--api-key-env", metavar="VAR", help="Name of the environment variable holding the API key (llm).")
@click.option("--cache", "cache_path", type=OUT_FILE, envvar="CXRGROUND_LLM_CACHE",
              help="SQLite response cache (llm); reruns with the same prompts make no request. Default: in memory.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, help="Requests in flight at most (llm).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=RetryPolicy.timeout,
              help="Seconds per request (llm).")
@click.option("--max-retries", type=click.IntRange(min=0), default=RetryPolicy.max_attempts - 1,
              help="Retries on 429 / 5xx / timeouts (llm).")
@click.option("--temperature", type=float, default=0.0, help="Sampling temperature (llm).")
@click.option("--out", type=OUT_FILE,
              help="Write the finding lines here (failures go to OUT.failures.jsonl) instead of stdout.")
@click.option("--progress/--no-progress", default=True, show_default=False,
              help="Progress bar on stderr for large batches.")
def structure(paths: tuple[Path, ...], structurer_name: str, sections: str, alternatives: str | None,
              base_url: str | None, model: str | None, api_key_env: str | None, cache_path: Path | None,
              concurrency: int, timeout: float, max_retries: int, temperature: float, out: Path | None,
              progress: bool) -> None:
    """Structure report files (or folders of them) into findings: one JSON line per finding.

    Each line holds the report id, the chosen section, the sentence, and the finding (entity, sent_idx,
    assertion, presence, certainty, lesion, location_phrases, reported_location, source); LLM lines also
    carry the provenance (model, decoding settings, prompt versions and hashes). Reports that cannot be
    structured are printed as {"failure": ...} lines (or written to OUT.failures.jsonl with --out).
    """
    files = expand_report_paths(paths)
    show = progress and len(files) > 50
    parsed, failures = read_reports(files, progress=show)
    given = {"alternatives": alternatives, "base_url": base_url or "", "model": model or "", "api_key_env": api_key_env,
             "cache": cache_path, "concurrency": concurrency, "timeout": timeout, "max_retries": max_retries,
             "temperature": temperature}
    try:
        structurer = get_structurer(structurer_name, **structurer_options(structurer_name, given))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    done, failed = structure_reports(parsed, structurer, progress=show, sections=sections)
    failures.extend(failed)
    lines, notes = finding_output(done, failures, structurer, out)
    for line in lines:
        click.echo(line)
    for note in notes:
        click.echo(note, err=True)
    if failures and not done:
        sys.exit(1)

COMMANDS: list[click.Command] = []
