"""The LLM structurer over many reports: bounded concurrency over a lazy stream, retries, the response cache as the
resume point, and the build's pre-pass that fills the cache before the workers run."""

from __future__ import annotations

import json

from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import IlsConfig
from cxrground.ils.pipeline import prestructure
from cxrground.ils.tasks import StudyTask
from cxrground.reports import parse_report_text, select_section
from cxrground.reports.structure.llm import LLMStructurer
from cxrground.testing.mock_server import MockServer

N = 40


def _no_findings(body: dict) -> str:
    return json.dumps({"findings": []})


def _sections(n: int, seen: list[int]):
    for k in range(n):
        seen.append(k)
        report = parse_report_text(f"FINDINGS: Report number {k}. The lungs are clear.\n", report_id=f"s{k}")
        yield f"s{k}", select_section(report, "findings")


def test_warm_cache_is_bounded_retries_and_resumes_from_the_cache(tmp_path):
    cache = tmp_path / "llm.sqlite"
    seen: list[int] = []
    with MockServer(_no_findings, latency=0.05, faults=["500", "429", "ok"]) as server:
        structurer = LLMStructurer(server.base_url, "mock", cache=cache, concurrency=6, backoff=0.01)
        counts = structurer.warm_cache(_sections(N, seen))
        assert counts["reports"] == N and counts["failed"] == 0 and counts["retries"] == 2
        assert 2 <= server.max_inflight <= 6  # concurrent, never more than the bound
        assert server.completed == N and len(seen) == N
        structurer.cache.close()
        # a second run (a resumed build) is answered from the cache: no request reaches the server
        before = server.requests
        again = LLMStructurer(server.base_url, "mock", cache=cache, concurrency=6)
        counts = again.warm_cache(_sections(N, []))
        assert counts["reports"] == N and counts["cache_hits"] == N and server.requests == before
        # the per-study call of a worker is a cache hit too
        section = select_section(parse_report_text("FINDINGS: Report number 3. The lungs are clear.\n"), "findings")
        assert again.structure("s3", section).findings == () and server.requests == before


def test_build_prepass_structures_the_pending_reports_once(tmp_path):
    tasks = [StudyTask(f"s{k}", "p1", "d", "/nonexistent.jpg", "x.jpg", "train",
                       report_text=f"FINDINGS: Report number {k}. The lungs are clear.\n") for k in range(12)]
    with MockServer(_no_findings) as server:
        spec = BackendSpec(structurer="llm", structurer_kwargs={"base_url": server.base_url, "model": "mock",
                                                               "cache": str(tmp_path / "c.sqlite"),
                                                               "concurrency": 4})
        counts = prestructure(iter(tasks), IlsConfig(), spec)
        assert counts is not None and counts["reports"] == 12 and server.completed == 12
        assert prestructure(iter(tasks), IlsConfig(), spec)["cache_hits"] == 12 and server.completed == 12
        no_cache = BackendSpec(structurer="llm", structurer_kwargs={"base_url": server.base_url, "model": "mock"})
        assert prestructure(iter(tasks), IlsConfig(), no_cache) is None
    assert prestructure(iter(tasks), IlsConfig(), BackendSpec()) is None


def test_a_build_resumes_when_only_how_the_llm_is_reached_changed(tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main

    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--out", str(tmp_path / "cohort"), "--studies", "3", "--seed", "0",
                                "--quiet"]).exit_code == 0

    def build(server: MockServer, *opts: str):
        return runner.invoke(main, ["ils", "build", "--images", str(tmp_path / "cohort" / "files"), "--out",
                                    str(tmp_path / "ils"), "--seed", "0", "--quiet", "--synthesizer", "pseudo-normal",
                                    "--structurer", "llm", "--structurer-opt", f"base_url={server.base_url}",
                                    *opts])

    with MockServer(_no_findings) as first:
        done = build(first, "--structurer-opt", "model=mock", "--structurer-opt", "concurrency=2",
                     "--structurer-opt", f"cache={tmp_path / 'a.sqlite'}")
        assert done.exit_code == 0 and "(3 processed, 0 already done" in done.output, done.output
    with MockServer(_no_findings) as moved:  # the server moved, the cache too, more requests at once
        again = build(moved, "--structurer-opt", "model=mock", "--structurer-opt", "concurrency=4",
                      "--structurer-opt", f"cache={tmp_path / 'b.sqlite'}")
        assert again.exit_code == 0 and "(0 processed, 3 already done" in again.output, again.output
        other = build(moved, "--structurer-opt", "model=another")  # another model answers otherwise
        assert other.exit_code != 0 and "holds a build with other settings" in other.output
        assert "structurer_kwargs.model mock then, another now" in other.output


def test_the_cohort_fit_reads_reports_the_concurrent_prepass_structured(tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main

    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--out", str(tmp_path / "cohort"), "--studies", "6", "--seed", "0",
                                "--quiet"]).exit_code == 0
    with MockServer(_no_findings, latency=0.2) as server:  # the default synthesizer fits on report-normal studies
        result = runner.invoke(main, ["ils", "build", "--images", str(tmp_path / "cohort" / "files"), "--out",
                                      str(tmp_path / "ils"), "--seed", "0", "--quiet", "--structurer", "llm",
                                      "--structurer-opt", f"base_url={server.base_url}", "--structurer-opt",
                                      "model=mock", "--structurer-opt", "concurrency=4", "--structurer-opt",
                                      f"cache={tmp_path / 'cache.sqlite'}"])
        assert result.exit_code == 0, result.output
        assert server.max_inflight > 1  # the fit's reports were asked concurrently, not one at a time
        assert server.completed == 6  # once each: the fit and the workers read them from the cache
