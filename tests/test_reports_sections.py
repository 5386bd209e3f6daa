"""MIMIC-style section parsing, the ILS §6 section choice, and reading free-text reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cxrground.errors import ReportError
from cxrground.reports import (
    NO_SECTION_REASON,
    choose_section,
    find_headings,
    last_paragraph,
    normalise_heading,
    parse_report_text,
    parse_sections,
    read_report,
    read_report_table,
)


def _mimic(text: str) -> str:
    """Lay ``text`` out like a MIMIC-CXR report file: one leading space on every line (so blank lines
    are " "), and a trailing space after headings that end their line."""
    lines = [" " + line for line in text.split("\n")[:-1]]
    return "\n".join(f"{line} " if line.endswith(":") else line for line in lines) + "\n"


# Written like MIMIC-CXR free-text reports: a right-aligned FINAL REPORT title, headings on their own
# line or followed by text, " \n" between paragraphs, ___ de-identification blanks.
FULL_REPORT = _mimic(
    """\
WET READ: ___ ___ 4:52 PM
  No acute cardiopulmonary process.
______________________________________________________________________________
                                 FINAL REPORT
EXAMINATION:  CHEST (PA AND LAT)

INDICATION:  ___ year old woman with ___ and new cough  // ? pneumonia

COMPARISON:  Chest radiograph from ___.

FINDINGS:

PA and lateral views of the chest provided.  There is a 1.5 cm nodular
opacity in the right upper lobe, approx. unchanged vs. the prior study.
Heart size is normal.  No pleural effusion or
pneumothorax.  Dr. ___ was notified at 3:12 p.m. on ___.

IMPRESSION:

1. Stable 1.5 cm right upper lobe nodule
2. No acute cardiopulmonary process.
"""
)

IMPRESSION_ONLY = _mimic(
    """\
                                 FINAL REPORT
EXAMINATION:  CHEST (PORTABLE AP)

INDICATION:  ___-year-old man status post intubation.  Evaluate ETT.

TECHNIQUE:  Single portable AP view of the chest.

COMPARISON:  ___ at 05:12.

FINDINGS:

IMPRESSION:

1.  Endotracheal tube terminates 4 cm above the carina.
2.  Mild pulmonary edema, slightly improved.
3.  Possible small left pleural effusion.
"""
)

NO_HEADED_FINDINGS = _mimic(
    """\
                                 FINAL REPORT
HISTORY:  ___-year-old female with shortness of breath.

COMPARISON:  ___.

Single portable AP view of the chest was obtained.  Lines and tubes are
unchanged in position.

Mild pulmonary edema has improved.  Retrocardiac opacity
likely reflects atelectasis.  No pneumothorax.
"""
)

ONLY_HEADERS = _mimic(
    """\
                                 FINAL REPORT
EXAMINATION:  CHEST (PA AND LAT)

INDICATION:  Cough.

COMPARISON:  None.
"""
)


def test_full_report_sections() -> None:
    assert "\n \n FINDINGS: \n \n PA and lateral" in FULL_REPORT  # the MIMIC layout the parser must handle
    report = parse_report_text(FULL_REPORT, report_id="s50000001")
    assert report.format == "mimic"
    assert list(report.sections) == ["wet read", "examination", "indication", "comparison", "findings", "impression"]
    assert report.sections["wet read"] == "___ ___ 4:52 PM\nNo acute cardiopulmonary process."
    assert report.indication == "___ year old woman with ___ and new cough  // ? pneumonia"
    assert report.comparison == "Chest radiograph from ___."
    assert report.findings == (
        "PA and lateral views of the chest provided.  There is a 1.5 cm nodular\n"
        "opacity in the right upper lobe, approx. unchanged vs. the prior study.\n"
        "Heart size is normal.  No pleural effusion or\n"
        "pneumothorax.  Dr. ___ was notified at 3:12 p.m. on ___."
    )
    assert report.impression == "1. Stable 1.5 cm right upper lobe nodule\n2. No acute cardiopulmonary process."
    assert report.last_paragraph is None  # only computed when findings and impression are both missing
    assert report.text == FULL_REPORT


def test_choice_findings_branch() -> None:
    choice = choose_section(parse_report_text(FULL_REPORT))
    assert choice is not None
    assert choice.name == "findings"
    assert choice.section_content == (
        "(1) PA and lateral views of the chest provided. "
        "(2) There is a 1.5 cm nodular opacity in the right upper lobe, approx. unchanged vs. the prior study. "
        "(3) Heart size is normal. "
        "(4) No pleural effusion or pneumothorax. "
        "(5) Dr. ___ was notified at 3:12 p.m. on ___."
    )
    assert [s.index for s in choice.sentences] == [1, 2, 3, 4, 5]
    assert choice.sentence(3).text == "Heart size is normal."


def test_choice_impression_branch_when_findings_heading_is_empty() -> None:
    report = parse_report_text(IMPRESSION_ONLY)
    assert "findings" not in report.sections
    assert list(report.sections) == ["examination", "indication", "technique", "comparison", "impression"]
    choice = choose_section(report)
    assert choice is not None
    assert choice.name == "impression"
    assert choice.section_content == (
        "(1) Endotracheal tube terminates 4 cm above the carina. "
        "(2) Mild pulmonary edema, slightly improved. "
        "(3) Possible small left pleural effusion."
    )


def test_choice_last_paragraph_branch() -> None:
    report = parse_report_text(NO_HEADED_FINDINGS)
    assert list(report.sections) == ["history", "comparison", "last_paragraph"]
    assert report.last_paragraph == (
        "Mild pulmonary edema has improved.  Retrocardiac opacity\nlikely reflects atelectasis.  No pneumothorax."
    )
    choice = choose_section(report)
    assert choice is not None
    assert choice.name == "last_paragraph"
    assert choice.section_content == (
        "(1) Mild pulmonary edema has improved. (2) Retrocardiac opacity likely reflects atelectasis. "
        "(3) No pneumothorax."
    )


def test_choice_none_when_no_usable_section() -> None:
    report = parse_report_text(ONLY_HEADERS)
    assert list(report.sections) == ["examination", "indication", "comparison"]
    assert choose_section(report) is None
    assert NO_SECTION_REASON == "no usable section"


def test_findings_with_only_deidentification_blanks_falls_back() -> None:
    report = parse_report_text(" FINDINGS:  ___ XXXX.\n \n IMPRESSION:  No acute process.\n")
    assert report.findings == "___ XXXX."
    choice = choose_section(report)
    assert choice is not None and choice.name == "impression"
    assert choice.section_content == "(1) No acute process."


def test_plain_text_is_last_paragraph() -> None:
    report = parse_report_text("Heart size is normal.\nLungs are clear.\n\nSmall left pleural effusion.", "p1")
    assert report.format == "text"
    assert report.sections == {"last_paragraph": "Small left pleural effusion."}
    choice = choose_section(report)
    assert choice is not None and choice.section_content == "(1) Small left pleural effusion."


def test_single_line_report_and_title_case_headings() -> None:
    inline = parse_report_text("INDICATION: Cough.  FINDINGS: Lungs are clear. IMPRESSION: Normal chest.")
    assert inline.sections == {"indication": "Cough.", "findings": "Lungs are clear.", "impression": "Normal chest."}
    titled = parse_report_text("Findings: Heart size normal.\nImpression: Normal.\nChest wall: intact.")
    assert titled.sections == {"findings": "Heart size normal.", "impression": "Normal.\nChest wall: intact."}


def test_unknown_upper_case_label_inside_paragraph_is_text() -> None:
    text = " FINDINGS:\n Lines and tubes:\n ETT: 4 cm above the carina.\n \n IMPRESSION:  Appropriate ETT position.\n"
    report = parse_report_text(text)
    assert report.findings == "Lines and tubes:\nETT: 4 cm above the carina."
    assert [h.name for h in find_headings(text)] == ["findings", "impression"]


def test_view_title_heading_and_bare_heading() -> None:
    report = parse_report_text(" CHEST, PA AND LATERAL:\n \n INDICATION:  Cough.\n \n IMPRESSION\n No acute process.\n")
    assert report.sections == {"indication": "Cough.", "impression": "No acute process."}


def test_repeated_heading_keeps_last_non_empty() -> None:
    report = parse_report_text(" FINDINGS:  Heart normal.\n \n FINDINGS:  Lungs clear.\n \n FINDINGS:\n")
    assert report.findings == "Lungs clear."


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("FINDINGS", "findings"),
        ("Finding", "findings"),
        ("IMPRESSIONS", "impression"),
        ("CONCLUSION", "impression"),
        ("FINDINGS AND IMPRESSION", "impression"),
        ("FINDINGS/IMPRESSION", "impression"),
        ("IMPRESSION AND RECOMMENDATIONS", "impression"),
        ("REASON FOR EXAMINATION", "indication"),
        ("CLINICAL HISTORY", "history"),
        ("COMPARISONS", "comparison"),
        ("EXAM", "examination"),
        ("WET READ", "wet read"),
        ("RECOMMENDATION(S)", "recommendations"),
        ("PA AND LATERAL VIEWS OF THE CHEST", "findings"),
        ("ETT", None),
    ],
)
def test_normalise_heading(raw: str, name: str | None) -> None:
    assert normalise_heading(raw) == name


def test_last_paragraph_function() -> None:
    assert last_paragraph(NO_HEADED_FINDINGS) == (
        "Mild pulmonary edema has improved.  Retrocardiac opacity\nlikely reflects atelectasis.  No pneumothorax."
    )
    assert last_paragraph(ONLY_HEADERS) is None
    assert parse_sections("  \n") == {}


def test_read_text_report_file(tmp_path: Path) -> None:
    path = tmp_path / "s50000001.txt"
    path.write_text(FULL_REPORT, encoding="utf-8")
    report = read_report(path)
    assert report.report_id == "s50000001"
    assert report.source == str(path)
    assert report.format == "mimic"
    assert choose_section(report).name == "findings"  # type: ignore[union-attr]


def test_parse_report_text_default_id_is_stable() -> None:
    a = parse_report_text("Lungs clear.")
    assert a.report_id == parse_report_text("Lungs clear.").report_id
    assert a.report_id.startswith("text-")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b"  \n\t \n", "whitespace-only"),
        (b"FINDINGS: caf\xe9 au lait", "not valid UTF-8: byte 0xe9 at offset 13"),
    ],
)
def test_bad_text_files_raise_with_path_and_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ReportError) as info:
        read_report(path)
    assert str(path) in str(info.value)
    assert reason in str(info.value)
    assert info.value.path == str(path)


def test_missing_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "nope.txt"
    with pytest.raises(ReportError, match="file does not exist") as info:
        read_report(path)
    assert str(path) in str(info.value)


def test_parse_report_text_rejects_empty() -> None:
    with pytest.raises(ReportError, match="empty report text"):
        parse_report_text("")
    with pytest.raises(ReportError, match="whitespace-only report text"):
        parse_report_text(" \n ")


def test_read_report_table_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    rows = [
        json.dumps({"study": "s1", "report": FULL_REPORT}),
        "",
        json.dumps({"study": "s2", "report": "   "}),
        "{not json",
        json.dumps({"study": "s1", "report": "Lungs clear."}),
        json.dumps({"study": 3, "report": IMPRESSION_ONLY}),
        json.dumps({"report": "Lungs clear."}),
        json.dumps(["s4", "Lungs clear."]),
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    reports, failures = read_report_table(path, "study", "report", progress=False)
    assert [r.report_id for r in reports] == ["s1", "3"]
    assert reports[0].source == f"{path}:1"
    assert choose_section(reports[1]).name == "impression"  # type: ignore[union-attr]
    assert [(f.path, f.stage) for f in failures] == [(f"{path}:{n}", "reports") for n in (3, 4, 5, 7, 8)]
    reasons = [f.reason for f in failures]
    assert "whitespace-only report text" in reasons[0]
    assert reasons[1].startswith("invalid JSON")
    assert reasons[2] == f"duplicate report id 's1' (first at {path}:1)"
    assert "missing or empty id column 'study'" in reasons[3]
    assert "expected an object" in reasons[4]


def test_read_report_table_csv(tmp_path: Path) -> None:
    path = tmp_path / "reports.csv"
    multi_line = NO_HEADED_FINDINGS.replace('"', '""')
    path.write_text(f'id,text\na,"{multi_line}"\nb,\nc,Heart size normal.\n', encoding="utf-8")
    reports, failures = read_report_table(path, "id", "text", progress=False)
    assert [r.report_id for r in reports] == ["a", "c"]
    assert choose_section(reports[0]).name == "last_paragraph"  # type: ignore[union-attr]
    assert len(failures) == 1
    assert failures[0].path == f"{path}:{2 + NO_HEADED_FINDINGS.count(chr(10)) + 1}"
    assert failures[0].reason == "empty report text"
    with pytest.raises(ReportError, match="'body' not found") as info:
        read_report_table(path, "id", "body")
    assert str(path) in str(info.value)
    with pytest.raises(ReportError, match="unsupported report table type"):
        read_report_table(tmp_path / "reports.parquet", "id", "text")


def test_a_report_that_is_only_a_wet_read_is_read_from_it() -> None:
    text = "WET READ: ___ ___ 10:22 PM\n  Small left effusion, retrocardiac atelectasis. No PTX.\n"
    sections = parse_sections(text)
    assert "Small left effusion" in sections["last_paragraph"]
    both = "WET READ: ___ ___ 10:22 PM\n  Small left effusion.\n\nFINDINGS: Small left effusion, unchanged.\n"
    assert "last_paragraph" not in parse_sections(both)  # the final report's findings are read, not the wet read
    history = "INDICATION: Fever.\n\nHISTORY: Pneumonia.\n"
    assert "last_paragraph" not in parse_sections(history)  # other known headings are still never read as findings


def test_reports_sections_numbers_the_sentences_of_any_policy_as_reports_label_does(tmp_path):
    """`reports sections --sections findings+impression` shows the sentences numbered as `reports label` (whose
    default policy that is) cites them; a report with no usable section is a failure there too."""
    from click.testing import CliRunner

    from cxrground.cli import main

    report = tmp_path / "r1.txt"
    report.write_text("FINDINGS: Heart size is normal. No effusion.\n\nIMPRESSION: Possible right lower lobe "
                      "pneumonia.\n")
    (tmp_path / "r2.txt").write_text("INDICATION: Cough.\n")
    label = CliRunner().invoke(main, ["reports", "label", str(report), "--format", "jsonl", "--no-progress"])
    cited = json.loads(label.output.splitlines()[0])["labels"]["pneumonia"]["sentences"]
    res = CliRunner().invoke(main, ["reports", "sections", str(report), "--sections", "findings+impression"])
    assert res.exit_code == 0 and cited == [3], res.output
    assert "findings+impression: (1) Heart size is normal. (2) No effusion. (3) Possible right lower lobe " \
           "pneumonia." in res.output
    res = CliRunner().invoke(main, ["reports", "sections", str(report)])
    assert "findings: (1) Heart size is normal. (2) No effusion." in res.output and "(3)" not in res.output
    res = CliRunner().invoke(main, ["reports", "sections", str(tmp_path), "--json"])
    lines = [json.loads(line) for line in res.output.splitlines()]
    assert [r.get("report_id") for r in lines[:2]] == ["r1", "r2"] and lines[1]["choice"] is None
    assert lines[2]["failure"] == {"path": str(tmp_path / "r2.txt"), "stage": "reports", "reason": NO_SECTION_REASON,
                                   "error": "ReportError", "report": "r2"}
    assert res.exit_code == 0


def test_utf16_reports_and_tables_with_a_byte_order_mark_are_read(tmp_path):
    """Windows' "Unicode" text export (UTF-16 with a byte-order mark) is read like UTF-8: a text report, an Open-i
    XML that declares UTF-16, a report table and a CSV index; text in another encoding is still refused by name."""
    from cxrground.datasets.folder import scan_folder
    from masks_helpers import blank_image

    text = "FINDINGS: Small right pleural effusion. Café-au-lait spot.\r\n"
    for bom, codec in (("\ufeff", "utf-16-le"), ("\ufeff", "utf-16-be")):
        (tmp_path / "r.txt").write_bytes((bom + text).encode(codec))
        report = read_report(tmp_path / "r.txt")
        assert report.sections["findings"] == "Small right pleural effusion. Café-au-lait spot."
    xml = ('<?xml version="1.0" encoding="UTF-16"?><eCitation><uId id="CXR1"/><MedlineCitation><Article><Abstract>'
           '<AbstractText Label="FINDINGS">Heart size normal.</AbstractText></Abstract></Article></MedlineCitation>'
           '</eCitation>')
    (tmp_path / "r.xml").write_bytes(xml.encode("utf-16"))
    assert read_report(tmp_path / "r.xml").sections["findings"] == "Heart size normal."
    (tmp_path / "t.csv").write_bytes("study_id,report\n1,FINDINGS: Clear.\n".encode("utf-16"))
    rows, failures = read_report_table(tmp_path / "t.csv", "study_id", "report")
    assert [r.report_id for r in rows] == ["1"] and not failures
    blank_image(tmp_path / "img" / "a.png")
    (tmp_path / "index.csv").write_bytes("image,study_id,report\na.png,1,FINDINGS: x.\n".encode("utf-16"))
    studies, failures = scan_folder(tmp_path / "img", index=tmp_path / "index.csv")
    assert [s.study_id for s in studies] == ["s1"] and not failures
    (tmp_path / "latin.txt").write_bytes(text.encode("latin-1"))
    with pytest.raises(ReportError, match="not valid UTF-8: byte 0xe9 at offset 43"):
        read_report(tmp_path / "latin.txt")
