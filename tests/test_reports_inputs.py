"""What the reports commands read: a table of reports named on the command line (one report per row, the columns
of `ils build --reports`), a file named twice read once, and a one-paragraph note under an unknown heading."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ReportError
from cxrground.reports.readers import expand_report_paths, read_report, read_reports
from cxrground.reports.sections import choose_section, parse_sections


def _label(*args: str) -> tuple[int, list[dict[str, str]], str]:
    run = CliRunner().invoke(main, ["reports", "label", *args])
    table = run.stdout.split("{")[0]
    return run.exit_code, list(csv.DictReader(io.StringIO(table))), run.output


def test_a_csv_named_on_the_command_line_is_a_table_of_reports(tmp_path):
    table = tmp_path / "reports.csv"
    table.write_text('study_id,report\ns1,"FINDINGS: Small left effusion."\ns2,"FINDINGS: No effusion."\n'
                     's1,"FINDINGS: Large right effusion."\n', encoding="utf-8")
    code, rows, output = _label(str(table))
    assert code == 0, output
    assert [(r["report_id"], r["effusion"], r["effusion_sides"]) for r in rows] == [("s1", "1", "left"),
                                                                                  ("s2", "0", "")]
    assert "duplicate report id 's1'" in output and "reports.csv:4" in output  # the repeated id: a failure

    jsonl = tmp_path / "reports.jsonl"
    jsonl.write_text(json.dumps({"study_id": "s9", "report": "IMPRESSION: Mild cardiomegaly."}) + "\n")
    code, rows, output = _label(str(jsonl), "--format", "csv")
    assert code == 0 and [(r["report_id"], r["cardiomegaly"]) for r in rows] == [("s9", "1")]


def test_a_table_without_the_report_columns_is_refused_by_name(tmp_path):
    table = tmp_path / "wrong columns.csv"
    table.write_text('id,text\ns1,"Small left effusion."\n', encoding="utf-8")
    code, rows, output = _label(str(table))
    assert code == 1 and rows == []
    assert "wrong columns.csv" in output and "'study_id', 'report' not found" in output
    reports, failures = read_reports([table], progress=False)
    assert reports == [] and len(failures) == 1
    with pytest.raises(ReportError, match="table of reports") as raised:
        read_report(table)
    assert "wrong columns.csv" in str(raised.value)


def test_a_report_named_twice_is_read_once(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    report = folder / "r1.txt"
    report.write_text("FINDINGS: Small left effusion.", encoding="utf-8")
    assert expand_report_paths([report, report, folder, tmp_path / "reports" / ".." / "reports" / "r1.txt"]) == \
        [report]
    code, rows, output = _label(str(report), str(report), str(folder))
    assert code == 0 and [r["report_id"] for r in rows] == ["r1"], output


def test_a_one_paragraph_note_under_an_unknown_heading_is_read_as_its_last_paragraph():
    note = ("PC: Dyspnea and fever. BG: Asthma. Patchy areas of air space opacification bilaterally with a lower "
            "zone predominance.")
    sections = parse_sections(note)
    assert sections["last_paragraph"].startswith("Dyspnea and fever.")
    # a known heading's text is never read as findings: indication, history, comparison
    for text in ("INDICATION: Cough. Small left pleural effusion.", "COMPARISON: None.\nSmall left effusion.",
                 "HISTORY: Pneumonia."):
        assert "last_paragraph" not in parse_sections(text), text
    # a paragraph without a heading still wins over an unknown heading's text
    assert parse_sections("PC: Fever.\n\nSmall left pleural effusion.")["last_paragraph"] == \
        "Small left pleural effusion."
    # findings present: no last paragraph at all
    assert "last_paragraph" not in parse_sections("PC: Fever.\n\nFINDINGS: Small left pleural effusion.")


def test_the_unknown_heading_note_is_chosen_by_ils_section_choice():
    from cxrground.reports.readers import parse_report_text

    report = parse_report_text("PC: Fever. Patchy opacification bilaterally.", report_id="n1")
    choice = choose_section(report)
    assert choice is not None and choice.name == "last_paragraph"


def test_rejected_llm_values_are_named_on_stderr_or_written_beside_the_output(tmp_path):
    from types import SimpleNamespace

    from cxrground.reports.findings import rejection_notes

    rejected = [{"report_id": f"r{i}", "field": "lesion", "value": "pneumothorax", "reason": "not one of the seven"}
                for i in range(7)]
    structurer = SimpleNamespace(rejections=rejected)
    (note,) = rejection_notes(structurer)
    assert note.startswith("7 out-of-vocabulary values rejected")
    assert "r0: lesion 'pneumothorax' (not one of the seven)" in note and "and 2 more" in note
    out = tmp_path / "findings.jsonl"
    (note,) = rejection_notes(structurer, out)
    written = tmp_path / "findings.jsonl.rejections.jsonl"
    assert str(written) in note
    assert [json.loads(line)["report_id"] for line in written.read_text().splitlines()] == [f"r{i}" for i in range(7)]
    assert rejection_notes(SimpleNamespace(rejections=[]), out) == [] and not written.exists()
    assert rejection_notes(SimpleNamespace()) == []


def test_an_option_of_the_other_structurer_is_refused_not_ignored(tmp_path, monkeypatch):
    report = tmp_path / "r1.txt"
    report.write_text("FINDINGS: Small left effusion.", encoding="utf-8")
    for command, extra, flag in (("label", ["--model", "m"], "--model"),
                                 ("structure", ["--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
                                 ("label", ["--cache", str(tmp_path / "c.sqlite")], "--cache"),
                                 ("label", ["--structurer", "llm", "--alternatives", "present"], "--alternatives")):
        run = CliRunner().invoke(main, ["reports", command, str(report), *extra])
        assert run.exit_code == 2 and f"{flag} applies to the" in run.output, run.output
    # a value from an environment variable is no command-line choice: the rules run
    monkeypatch.setenv("CXRGROUND_LLM_MODEL", "m")
    code, rows, output = _label(str(report))
    assert code == 0 and rows[0]["effusion"] == "1", output


def test_a_report_id_depends_on_its_own_file_only(tmp_path):
    """A text report's id is its file name without the suffix, whatever other files are given with it: adding an
    unrelated report, or one of the same name in another folder, changes no id; the later of two reports of one id
    is a failure naming the first (the output could not tell them apart)."""
    for folder, name, text in (("a", "good", "FINDINGS: Small left effusion."), ("a", "s2", "FINDINGS: Clear."),
                               ("b", "good", "FINDINGS: Mild cardiomegaly."), ("c", "other", "FINDINGS: Clear.")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{name}.txt").write_text(text, encoding="utf-8")
    alone = [str(tmp_path / "a")]
    code, rows, output = _label(*alone)
    assert code == 0, output
    ids = {r["report_id"]: r["effusion"] for r in rows}
    assert ids == {"good": "1", "s2": ""}
    for more in ([str(tmp_path / "c")], [str(tmp_path / "b"), str(tmp_path / "c")]):
        code, rows, output = _label(*alone, *more)
        assert code == 0, output
        assert {r["report_id"]: r["effusion"] for r in rows if r["report_id"] in ids} == ids, output
        assert [r["report_id"] for r in rows if r["report_id"] not in ids] == ["other"]
    good = tmp_path / "b" / "good.txt"
    failed = [json.loads(line)["failure"] for line in output.splitlines() if line.startswith('{"failure"')]
    assert [(f["path"], f["report"]) for f in failed] == [(str(good), "good")]
    assert failed[0]["reason"].startswith(f"duplicate report id 'good' (first at {tmp_path / 'a' / 'good.txt'})")
    out = tmp_path / "findings.jsonl"
    run = CliRunner().invoke(main, ["reports", "structure", str(tmp_path / "b"), *alone, "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert {json.loads(line)["report_id"] for line in out.read_text().splitlines()} == {"good", "s2"}
    failures = [json.loads(line) for line in (tmp_path / "findings.jsonl.failures.jsonl").read_text().splitlines()]
    assert [(f["path"], f["report"]) for f in failures] == [(str(tmp_path / "a" / "good.txt"), "good")]
