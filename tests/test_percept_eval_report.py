"""The HTML report (loaded in headless Chromium) and the hf client's message conversion."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from click.testing import CliRunner
from PIL import Image

from cxrground.cli import main
from cxrground.evaluation.percept.clients.hf import to_hf_messages
from cxrground.testing.mock_bench import make_benchmark


def test_report_in_headless_chromium(tmp_path, page):
    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1, "RR": 1}, lesions=("opacity", "cardiomegaly"))
    runner = CliRunner()
    for spec in ("oracle", "random"):
        res = runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", spec, "--out",
                                   str(tmp_path / spec), "--no-progress"])
        assert res.exit_code == 0, res.output
    out = tmp_path / "report" / "report.html"
    res = runner.invoke(main, ["percept", "report", str(tmp_path / "oracle"), str(tmp_path / "random"), "--out",
                               str(out), "--bootstrap", "50"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    assert "<script" not in text
    assert (out.parent / "all_models_summary.csv").read_text().count("\n") == 1 + 2 * 2 * 3
    page.goto(out.as_uri())
    assert page.console_errors == []
    assert page.locator("table").count() >= 4
    assert page.locator("svg[role=img]").count() >= 5  # stage bars, depth, sub-tasks, 2 heatmaps
    assert "oracle [implicit]" in page.inner_text("body") and "random [implicit]" in page.inner_text("body")
    assert page.locator("svg rect").count() > 20


def _oracle_run(tmp_path: Path) -> Path:
    """``runs/`` holding ``oracle/``, the oracle's run on a 3-case opacity benchmark."""
    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1, "RR": 1}, lesions=("opacity",))
    runs = tmp_path / "runs"
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "oracle", "--out",
                                    str(runs / "oracle"), "--no-progress"])
    assert res.exit_code == 0, res.output
    return runs


def test_parse_labels_say_all_answers_parsed_instead_of_an_empty_chart(tmp_path):
    """When no answer of any run was unparseable, "Parse labels" says so in words; a run with unparseable answers
    gets the bar chart."""
    from cxrground.evaluation.percept.report import load_scores, render_report

    runs = _oracle_run(tmp_path)
    scores = load_scores([runs / "oracle"], n_boot=0)
    assert all(v["unparseable"] == 0 for v in scores[0]["parse"]["per_stage"].values() if v["unparseable"] is not None)
    parse = render_report(scores).split("<h2>Parse labels</h2>", 1)[1].split("<h2>", 1)[0]
    assert "All answers parsed (100 %)" in parse and "<svg" not in parse
    scores[0]["parse"]["per_stage"]["stage2"]["unparseable"] = 0.25
    parse = render_report(scores).split("<h2>Parse labels</h2>", 1)[1].split("<h2>", 1)[0]
    assert "All answers parsed" not in parse and "<title>unparseable rate by stage</title>" in parse
    assert "stage2: 0.250" in parse


def test_report_skips_files_among_the_runs(tmp_path):
    """`percept report runs/* --out runs/report.html`: the glob also names the response cache and the report files;
    they are skipped with a note, and a RUNS list with no folder is a usage error."""
    runs, runner = _oracle_run(tmp_path), CliRunner()
    (runs / "percept_cache.sqlite").write_bytes(b"")
    for _ in range(2):  # the second time the glob also names report.html and all_models_summary.csv
        names = sorted(str(p) for p in runs.iterdir())
        res = runner.invoke(main, ["percept", "report", *names, "--out", str(runs / "report.html"), "--bootstrap",
                                   "0"])
        assert res.exit_code == 0, res.output
        assert "skipped" in res.stderr and "percept_cache.sqlite" in res.stderr
    res = runner.invoke(main, ["percept", "report", str(runs / "percept_cache.sqlite"), "--out",
                               str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "no run folder" in res.output


def test_report_skips_run_folders_without_results(tmp_path):
    """A run stopped before its first case finished (a 404, an early kill) holds config.json and no results: `percept
    report runs/*` skips it with a note naming it and reports the others; with no run that has results it fails."""
    import shutil

    runs, runner = _oracle_run(tmp_path), CliRunner()
    stopped = runs / "stopped"
    stopped.mkdir()
    for name in ("config.json", "cases.json"):
        shutil.copy(runs / "oracle" / name, stopped / name)
    out = runs / "report.html"
    res = runner.invoke(main, ["percept", "report", str(runs / "oracle"), str(stopped), "--out", str(out),
                               "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    assert "no results yet" in res.stderr and str(stopped) in res.stderr
    assert out.is_file() and (runs / "all_models_summary.csv").read_text().count("\n") == 1 + 2 * 3
    res = runner.invoke(main, ["percept", "report", str(stopped), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 1 and "no run among RUNS has results" in res.output
    assert not (tmp_path / "r.html").exists()


def test_report_warns_about_runs_on_different_benchmark_builds(tmp_path):
    """Runs evaluated on two builds of a benchmark (different bench_sha256) share labels in the report: a warning
    names each build's runs, on stderr and in the HTML page; runs on one build get none."""
    runner = CliRunner()
    for name, seed in (("a", 0), ("b", 1)):
        bench = make_benchmark(tmp_path / f"bench_{name}", {"LF": 1, "RF": 1, "RR": 1}, lesions=("opacity",),
                               seed=seed)
        for run in (name, f"{name}2"):
            res = runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random", "--oracle",
                                       "none", "--out", str(tmp_path / run), "--no-progress"])
            assert res.exit_code == 0, res.output
    out = tmp_path / "report.html"
    res = runner.invoke(main, ["percept", "report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out),
                               "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    assert "different benchmark builds" in res.stderr, res.stderr
    assert str(tmp_path / "a") in res.stderr and str(tmp_path / "b") in res.stderr
    assert "bench_a" in res.stderr and "bench_b" in res.stderr
    text = out.read_text()
    assert "class='warn'" in text and "different benchmark builds" in text
    res = runner.invoke(main, ["percept", "report", str(tmp_path / "a"), str(tmp_path / "a2"), "--out", str(out),
                               "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    assert "benchmark builds" not in res.stderr and "class='warn'" not in out.read_text()


def test_hf_message_conversion():
    buf = io.BytesIO()
    Image.new("L", (5, 4), 9).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    msgs = [{"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "q1"},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "image_url", "image_url": {"url": url}}]},
            {"role": "assistant", "content": "Answer: 1"},
            {"role": "user", "content": [{"type": "text", "text": "q2"}]}]
    out = to_hf_messages(msgs)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == [{"type": "text", "text": "sys"}]
    assert [p["type"] for p in out[1]["content"]] == ["text", "image", "image"]
    assert out[1]["content"][1]["image"].size == (5, 4) and out[1]["content"][1]["image"].mode == "RGB"
    assert out[2]["content"] == [{"type": "text", "text": "Answer: 1"}]
