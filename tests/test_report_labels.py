"""Per-report lesion labels (``cxrground.reports.labels``, ``cxrground reports label``): the roll-up rules on
hand-written findings and reports, the CSV / JSONL output and failures of the command, and agreement with the
IU MeSH major terms computed by the evaluation code (the same numbers as ``bench/structure.py``)."""

from __future__ import annotations

import csv
import importlib
import io
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.reports import make_section_choice, parse_report_text, read_report
from cxrground.reports.findings import Finding, StructuredReport
from cxrground.reports.labels import (
    LABEL_COLUMNS,
    LABEL_FIELDS,
    OPACITY_OBSERVED,
    LabelMention,
    LesionLabel,
    ReportLabels,
    is_opacity_phrase,
    label_lines,
    label_report,
    roll_up,
)
from cxrground.reports.structure import RuleStructurer, structure_report
from cxrground.vocab import LESIONS

RB, LB, RL, LL = "right lung base", "left lung base", "right lung", "left lung"
TEXT = ("Small right pleural effusion. Possible small left effusion. Right basilar opacity, likely atelectasis. "
        "No pneumothorax. No pulmonary edema. Pneumonia is not excluded.")


def _structured(*findings: Finding, n: int = 6) -> StructuredReport:
    section = make_section_choice("findings", " ".join(f"Sentence {i}." for i in range(1, n + 1)))
    assert section is not None and len(section.sentences) == n
    return StructuredReport("r1", section, findings)


def _labels(text: str, **options: str) -> ReportLabels:
    structured = structure_report(parse_report_text(f"FINDINGS: {text}\n", "r"), RuleStructurer(**options))
    assert structured is not None
    return label_report(structured)


def test_present_beats_uncertain_beats_absent() -> None:
    labels = label_report(_structured(
        Finding("effusion", 2, "uncertain", "effusion", reported_location=(LL,)),
        Finding("effusion", 1, "present", "effusion", reported_location=(RL,)),
        Finding("effusion", 3, "absent", "effusion", reported_location=(RL, LL)),
        Finding("edema", 4, "absent", "edema", reported_location=(RL, LL)),
        Finding("edema", 5, "uncertain", "edema", reported_location=(RL, LL)),
        Finding("pneumonia", 6, "absent", "pneumonia", reported_location=(RL, LL)),
        Finding("pneumonia", 1, "absent", "pneumonia", reported_location=(LB,)),
    ))
    # the sides and sentences are those of the mentions with the winning status only
    assert labels.lesions["effusion"] == LesionLabel("present", frozenset({"right"}), (1,))
    assert labels.lesions["edema"] == LesionLabel("uncertain", frozenset({"right", "left"}), (5,))
    # negated only: 0, without sides (a negation's location is where the lesion was looked for)
    assert labels.lesions["pneumonia"] == LesionLabel("absent", frozenset(), (1, 6))
    assert labels.codes() == {"cardiomegaly": None, "pneumonia": 0, "atelectasis": None, "opacity": None,
                              "consolidation": None, "edema": -1, "effusion": 1, OPACITY_OBSERVED: None}
    assert labels.section == "findings" and labels.report_id == "r1"


def test_not_mentioned_is_blank_and_non_targets_are_ignored() -> None:
    labels = label_report(_structured(Finding("pneumothorax", 4, "present", None, reported_location=(RL,)),
                                      Finding("nodule", 2, "absent", None)))
    assert all(code is None for code in labels.codes().values())
    row = labels.csv_row()
    assert list(row) == list(LABEL_COLUMNS)
    assert {k: v for k, v in row.items() if k not in ("report_id", "section")} == dict.fromkeys(LABEL_COLUMNS[2:], "")


def test_attributed_opacity_states_an_opacity() -> None:
    assert is_opacity_phrase("Opacity") and is_opacity_phrase("airspace disease")
    assert not is_opacity_phrase("pleural effusion") and not is_opacity_phrase("opacity and effusion")
    labels = label_report(_structured(
        Finding("opacity", 3, "uncertain", "atelectasis", reported_location=(RB,)),
        Finding("opacity", 5, "absent", "pneumonia", reported_location=(RL, LL)),
    ))
    # the hedged cause stays uncertain on the lesion field; the opacity itself is seen
    assert labels.code("atelectasis") == -1 and labels.code("opacity") is None
    assert labels.opacity_observed == LesionLabel("present", frozenset({"right"}), (3,))
    assert labels.code("pneumonia") == 0
    # a negated attributed phrase, or an opacity-class phrase of no lesion, states its own assertion
    only_negated = label_report(_structured(Finding("opacity", 5, "absent", "pneumonia")))
    assert only_negated.opacity_observed == LesionLabel("absent", frozenset(), (5,))
    unattributed = label_report(_structured(Finding("infiltrate", 2, "uncertain", None, reported_location=(LB,)),
                                            Finding("opacity", 4, "present", "opacity", reported_location=(RB,))))
    assert unattributed.opacity_observed == LesionLabel("present", frozenset({"right"}), (4,))
    assert unattributed.code("opacity") == 1


def test_rule_structured_report_labels() -> None:
    labels = _labels(TEXT)
    assert labels.codes() == {"cardiomegaly": None, "pneumonia": -1, "atelectasis": -1, "opacity": None,
                              "consolidation": None, "edema": 0, "effusion": 1, OPACITY_OBSERVED: 1}
    assert labels.lesions["effusion"] == LesionLabel("present", frozenset({"right"}), (1,))
    assert labels.csv_row()["atelectasis_sides"] == "right"
    assert labels.csv_row()[f"{OPACITY_OBSERVED}_sides"] == "right"


def test_alternatives_policy_reaches_the_labels() -> None:
    text = "Atelectasis or scarring at the left base."
    assert _labels(text).lesions["atelectasis"] == LesionLabel("uncertain", frozenset({"left"}), (1,))
    assert _labels(text, alternatives="present").lesions["atelectasis"] == LesionLabel("present", frozenset({"left"}),
                                                                                        (1,))


def test_roll_up_policies_and_bad_input() -> None:
    mentions = [LabelMention("edema", False, "uncertain", frozenset({"left"}), 2),
                LabelMention("edema", False, "present", frozenset({"right"}), 1)]
    assert roll_up(mentions, "edema") == ("present", (mentions[1],))
    assert roll_up(mentions, "edema", uncertain="present") == ("present", tuple(mentions))
    assert roll_up(mentions, "effusion") is None
    with pytest.raises(ValueError, match="unknown label field 'nodule'"):
        roll_up(mentions, "nodule")
    with pytest.raises(ValueError, match="unknown uncertain policy"):
        roll_up(mentions, "edema", uncertain="absent")
    with pytest.raises(ValueError, match="unknown label status"):
        LesionLabel("positive")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="right / left"):
        LesionLabel("present", frozenset({"bilateral"}))
    with pytest.raises(ValueError, match="exactly the lesions"):
        ReportLabels("r", "findings", {"edema": None})
    with pytest.raises(KeyError, match="unknown label field"):
        label_report(_structured()).label("nodule")
    with pytest.raises(ValueError, match="unknown label format"):
        label_lines([], "xlsx")


IU_XML = """<?xml version="1.0" encoding="utf-8"?>
<eCitation>
   <uId id="CXR9002"/>
   <MedlineCitation><Article><Abstract>
      <AbstractText Label="FINDINGS">Heart is enlarged. Small bilateral pleural effusions.</AbstractText>
      <AbstractText Label="IMPRESSION">Cardiomegaly. No pneumonia.</AbstractText>
   </Abstract></Article></MedlineCitation>
   <MeSH><major>Cardiomegaly/mild</major><major>Pleural Effusion/bilateral/small</major></MeSH>
</eCitation>
"""


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "9002.xml").write_text(IU_XML, encoding="utf-8")
    (folder / "s1.txt").write_text(f"FINDINGS: {TEXT}\n\nIMPRESSION: Right basilar atelectasis.\n", encoding="utf-8")
    (folder / "s2.txt").write_text("FINDINGS: Atelectasis or scarring at the left base.\n", encoding="utf-8")
    (folder / "corrupt.xml").write_text(IU_XML.replace("</MeSH>", ""), encoding="utf-8")
    return folder


def _cli() -> tuple[CliRunner, object]:
    importlib.import_module("cxrground.cli.structure_cmds")  # registers `reports label`
    from cxrground.cli import main

    return CliRunner(), main


def test_cli_csv_with_out_records_the_failure(tmp_path: Path) -> None:
    runner, main = _cli()
    folder, out = _folder(tmp_path), tmp_path / "out" / "labels.csv"
    result = runner.invoke(main, ["reports", "label", str(folder), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "3 reports labelled" in result.stderr and "1 failures" in result.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [r["report_id"] for r in rows] == ["CXR9002", "s1", "s2"]
    assert tuple(rows[0]) == LABEL_COLUMNS
    iu, s1, s2 = rows
    assert (iu["section"], iu["cardiomegaly"], iu["effusion"], iu["effusion_sides"], iu["pneumonia"]) == (
        "findings+impression", "1", "1", "right+left", "0")
    assert iu["cardiomegaly_sides"] == "" and iu["edema"] == "" and iu["atelectasis"] == ""
    # the impression states the atelectasis the findings hedged: present once both sections are read
    assert (s1["atelectasis"], s1["effusion"], s1["effusion_sides"], s1["edema"], s1[OPACITY_OBSERVED]) == (
        "1", "1", "right", "0", "1")
    assert s2["atelectasis"] == "-1"
    fail_lines = (tmp_path / "out" / "labels.csv.failures.jsonl").read_text(encoding="utf-8").splitlines()
    failures = [json.loads(line) for line in fail_lines]  # flat objects, as every failures.jsonl
    assert set(failures[0]) == {"path", "stage", "reason", "error"}
    assert len(failures) == 1 and failures[0]["path"].endswith("corrupt.xml")
    assert "malformed XML" in failures[0]["reason"]
    # a rerun without failures removes the stale failures file
    (folder / "corrupt.xml").unlink()
    assert runner.invoke(main, ["reports", "label", str(folder), "--out", str(out)]).exit_code == 0
    assert not (tmp_path / "out" / "labels.csv.failures.jsonl").exists()


def test_cli_stdout_formats_and_options(tmp_path: Path) -> None:
    runner, main = _cli()
    folder = _folder(tmp_path)
    result = runner.invoke(main, ["reports", "label", str(folder), "--format", "jsonl", "--alternatives", "present"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [x.get("report_id") for x in lines] == ["CXR9002", "s1", "s2", None]
    assert lines[-1]["failure"]["path"].endswith("corrupt.xml")
    assert set(lines[2]["labels"]) == set(LABEL_FIELDS)
    assert lines[2]["labels"]["atelectasis"] == {"status": "present", "code": 1, "sides": ["left"], "sentences": [1]}
    assert lines[2]["labels"]["effusion"] is None
    # CSV on stdout stays one table: the failure goes to stderr
    result = runner.invoke(main, ["reports", "label", str(folder), "--sections", "findings"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["report_id"], r["section"]) for r in rows] == [("CXR9002", "findings"), ("s1", "findings"),
                                                              ("s2", "findings")]
    assert rows[1]["atelectasis"] == "-1" and rows[0]["pneumonia"] == ""
    assert json.loads(result.stderr.splitlines()[-1])["failure"]["path"].endswith("corrupt.xml")
    # nothing labelled and something failed: exit status 1; a bad option value: a usage error
    result = runner.invoke(main, ["reports", "label", str(folder / "corrupt.xml")])
    assert result.exit_code == 1 and result.stdout.splitlines() == [",".join(LABEL_COLUMNS)]
    result = runner.invoke(main, ["reports", "label", str(folder), "--format", "xlsx"])
    assert result.exit_code == 2
    result = runner.invoke(main, ["reports", "label", str(folder), "--structurer", "llm", "--alternatives",
                                  "present", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert result.exit_code == 2 and "rules structurer only" in result.output


def _label_tallies(labels: dict[str, ReportLabels], reports: list, lesion: str, count: str) -> dict[str, int]:
    """MeSH agreement counts of the labels of ``lesion`` (opacity read on the opacity observation), counting codes 1
    (``present``; -1 too where the coders marked the term hedged) or 1 and -1 (``positive``)."""
    from cxrground.evaluation.report_quality import mesh_hedged, mesh_lesions

    tallies = {"tp": 0, "n_pred": 0, "n_true": 0}
    for report in reports:
        if report.report_id in labels:
            code = labels[report.report_id].code(OPACITY_OBSERVED if lesion == "opacity" else lesion)
            counted = (1, -1) if count == "positive" or lesion in mesh_hedged(report.mesh_major) else (1,)
            pred, true = code in counted, lesion in mesh_lesions(report.mesh_major)
            tallies["tp"] += pred and true
            tallies["n_pred"] += pred
            tallies["n_true"] += true
    return tallies


@pytest.mark.pack
def test_labels_of_the_iu_reports_agree_with_mesh(pack_dir: Path) -> None:
    from cxrground.evaluation.report_quality import OPACITY_OBSERVED as OPACITY_ROW
    from cxrground.evaluation.report_quality import mesh_cases, score_mesh_cases

    reports = [read_report(p) for p in sorted((pack_dir / "iu_reports").glob("*.xml"))]
    assert len(reports) == 300
    structurer = RuleStructurer()
    labels = {}
    for report in reports:
        structured = structure_report(report, structurer, "findings+impression")
        if structured is not None:
            labels[report.report_id] = label_report(structured)
    assert len(labels) == 297  # three reports have neither findings nor impression
    f1 = {}
    for count in ("positive", "present"):
        scores = score_mesh_cases(mesh_cases(structurer, reports), count=count)
        assert scores["n_reports"] == len(labels)
        for lesion in LESIONS:
            tallies = _label_tallies(labels, reports, lesion, count)
            # the labels are exactly what the MeSH scores count (one roll-up)
            row = scores["per_lesion"][OPACITY_ROW if lesion == "opacity" else lesion]
            assert tallies == {k: row[k] for k in tallies}, (count, lesion)
            tp, n_pred, n_true = tallies["tp"], tallies["n_pred"], tallies["n_true"]
            if n_true:
                f1[(count, lesion)] = 2 * tp / (n_pred + n_true)
    # measured (bench/structure.py, findings+impression, default alternatives): macro F1 0.918 counting codes 1,
    # 0.772 counting 1 and -1; cardiomegaly 0.982, opacity incl. attributed 0.989; floors a little below
    macro = {count: sum(v for (c, _), v in f1.items() if c == count) / sum(c == count for c, _ in f1)
             for count in ("positive", "present")}
    assert macro["present"] >= 0.9 and macro["positive"] >= 0.75
    assert f1[("present", "cardiomegaly")] >= 0.95 and f1[("present", "opacity")] >= 0.95
    codes = [x.codes() for x in labels.values()]
    assert sum(c["effusion"] == 0 for c in codes) >= 150  # "no pleural effusion" is the commonest negation


def test_cli_llm_structurer_gives_the_rule_labels(tmp_path: Path) -> None:
    from test_structure_llm import FakeLLM  # a mock OpenAI server answering with the rule structurer

    runner, main = _cli()
    report = tmp_path / "s1.txt"
    report.write_text(f"FINDINGS: {TEXT}\n\nIMPRESSION: Right basilar atelectasis.\n", encoding="utf-8")
    rules = runner.invoke(main, ["reports", "label", str(report), "--format", "jsonl"])
    with FakeLLM() as fake:
        llm = runner.invoke(main, ["reports", "label", str(report), "--format", "jsonl", "--structurer", "llm",
                                   "--base-url", fake.base_url, "--model", "fake-model", "--no-progress"])
        assert fake.requests >= 1
    assert rules.exit_code == 0 and llm.exit_code == 0, llm.output
    assert json.loads(llm.stdout) == json.loads(rules.stdout)
    assert json.loads(rules.stdout)["labels"]["atelectasis"]["code"] == 1


def test_likely_policy_promotes_only_likely_hedges() -> None:
    findings = (
        Finding("pneumonia", 1, "uncertain", "pneumonia", reported_location=(RB,), hedge="likely"),
        Finding("edema", 2, "uncertain", "edema", reported_location=(RL, LL), hedge="possible"),
        Finding("effusion", 3, "uncertain", "effusion", reported_location=(LL,)),  # ungraded (LLM): stays uncertain
    )
    default = label_report(_structured(*findings))
    likely = label_report(_structured(*findings), uncertain="likely")
    every = label_report(_structured(*findings), uncertain="present")
    assert [default.code(x) for x in ("pneumonia", "edema", "effusion")] == [-1, -1, -1]
    assert [likely.code(x) for x in ("pneumonia", "edema", "effusion")] == [1, -1, -1]
    assert [every.code(x) for x in ("pneumonia", "edema", "effusion")] == [1, 1, 1]
    with pytest.raises(ValueError, match="uncertain policy"):
        label_report(_structured(*findings), uncertain="sometimes")


def test_hedge_grade_needs_an_uncertain_finding() -> None:
    with pytest.raises(ValueError, match="hedge"):
        Finding("pneumonia", 1, "present", "pneumonia", hedge="likely")
    with pytest.raises(ValueError, match="hedge"):
        Finding("pneumonia", 1, "uncertain", "pneumonia", hedge="maybe")  # type: ignore[arg-type]
    f = Finding("pneumonia", 1, "uncertain", "pneumonia", hedge="likely")
    assert Finding.from_dict(f.to_dict()) == f


def test_label_command_uncertain_option(tmp_path: Path) -> None:
    from cxrground.cli import main

    (tmp_path / "a.txt").write_text("FINDINGS: Probable right lower lobe pneumonia. Possible small left effusion.\n")
    rows = {}
    for policy in ("uncertain", "likely", "present"):
        result = CliRunner().invoke(main, ["reports", "label", str(tmp_path / "a.txt"), "--uncertain", policy])
        assert result.exit_code == 0, result.output
        rows[policy] = next(csv.DictReader(io.StringIO(result.stdout)))
    assert (rows["uncertain"]["pneumonia"], rows["uncertain"]["effusion"]) == ("-1", "-1")
    assert (rows["likely"]["pneumonia"], rows["likely"]["effusion"]) == ("1", "-1")
    assert (rows["present"]["pneumonia"], rows["present"]["effusion"]) == ("1", "1")
    assert rows["likely"]["pneumonia_sides"] == "right"


@pytest.mark.parametrize(("text", "code", "sentences"), [
    ("Heart size is normal. Lungs are clear.", 0, (1,)),
    ("No effusion. The cardiomediastinal silhouette is within normal limits.", 0, (2,)),
    ("Normal heart size. No cardiomegaly.", 0, (1, 2)),
    ("Heart size is top normal.", None, ()),
    ("Heart size is at the upper limits of normal.", None, ()),
    # a range from normal is an uncertain cardiomegaly finding, not a normal statement
    ("Heart size is normal to mildly enlarged.", -1, (1,)),
    # a finding that states it wins over a normal statement, as present beats absent
    ("Heart size is normal. Borderline cardiomegaly.", -1, (2,)),
])
def test_a_normal_heart_size_statement_negates_cardiomegaly_in_the_labels(text: str, code: int | None,
                                                                          sentences: tuple[int, ...]) -> None:
    labels = _labels(text)
    assert labels.code("cardiomegaly") == code
    assert (labels.lesions["cardiomegaly"].sentences if code is not None else ()) == sentences


def test_a_normal_heart_size_statement_gives_no_finding() -> None:
    """The statement is a labels-only rule: the structured findings (and so ILS) have no cardiomegaly finding."""
    section = make_section_choice("findings", "Heart size is normal.")
    assert section is not None
    assert RuleStructurer().structure("r", section).findings == ()


def test_cli_reads_a_nested_mimic_style_folder_and_refuses_an_empty_one(tmp_path: Path) -> None:
    """MIMIC-CXR keeps its reports in files/p10/p10000032/s50414267.txt: a folder is searched with its subfolders,
    and a folder with no report file at all is an error, not an empty table."""
    runner, main = _cli()
    files = tmp_path / "files"
    for patient, study, text in (("p10000001", "s50000001", "FINDINGS: Small left pleural effusion."),
                                 ("p10000002", "s50000002", "FINDINGS: The lungs are clear.")):
        (files / "p10" / patient).mkdir(parents=True)
        (files / "p10" / patient / f"{study}.txt").write_text(text, encoding="utf-8")
    (files / "p10" / ".hidden.txt").write_text("FINDINGS: Pneumonia.", encoding="utf-8")
    out = tmp_path / "labels.csv"
    result = runner.invoke(main, ["reports", "label", str(files), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [(r["report_id"], r["effusion"], r["effusion_sides"]) for r in rows] == [
        ("s50000001", "1", "left"), ("s50000002", "", "")]
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    result = runner.invoke(main, ["reports", "label", str(tmp_path / "empty"), "--out", str(tmp_path / "x.csv")])
    assert result.exit_code != 0 and "no report files" in result.output and "Traceback" not in result.output


def test_a_report_far_larger_than_any_radiology_report_is_a_named_failure(tmp_path: Path) -> None:
    """A 1 MB "report" (a log, a concatenation) is refused with its size, and the other reports are labelled."""
    from cxrground.reports.readers import MAX_REPORT_SIZE

    runner, main = _cli()
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "s1.txt").write_text("FINDINGS: Small left pleural effusion.", encoding="utf-8")
    (folder / "s2.txt").write_text("FINDINGS: " + "Small left effusion. " * (MAX_REPORT_SIZE // 10), encoding="utf-8")
    out = tmp_path / "labels.csv"
    result = runner.invoke(main, ["reports", "label", str(folder), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert [r["report_id"] for r in csv.DictReader(io.StringIO(out.read_text(encoding="utf-8")))] == ["s1"]
    failure = json.loads((tmp_path / "labels.csv.failures.jsonl").read_text().splitlines()[0])
    assert failure["path"].endswith("s2.txt") and "radiology report stays under" in failure["reason"]


def test_out_dash_is_standard_output(tmp_path: Path, monkeypatch) -> None:
    runner, main = _cli()
    (tmp_path / "s1.txt").write_text("FINDINGS: Small left pleural effusion.", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for command in ("label", "structure"):
        result = runner.invoke(main, ["reports", command, str(tmp_path / "s1.txt"), "--out", "-", "--no-progress"])
        assert result.exit_code == 0, result.output
        assert "effusion" in result.output and not (tmp_path / "-").exists()


def test_a_table_of_reports_is_not_held_to_the_size_of_one_report(tmp_path: Path) -> None:
    """A table of 2,000 reports (hundreds of KB) is read in full; a row over the one-report cap fails alone."""
    from cxrground.ils.tasks import report_table
    from cxrground.reports.readers import MAX_REPORT_SIZE

    runner, main = _cli()
    table = tmp_path / "reports.jsonl"
    rows = [{"study_id": str(50000000 + i), "report": f"FINDINGS: Small left pleural effusion, number {i}. " * 4}
            for i in range(2000)]
    rows.append({"study_id": "59999999", "report": "FINDINGS: " + "Small left effusion. " * (MAX_REPORT_SIZE // 10)})
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert table.stat().st_size > 5 * MAX_REPORT_SIZE
    out = tmp_path / "labels.csv"
    result = runner.invoke(main, ["reports", "label", str(table), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert len(list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))) == 2000
    failure = json.loads((tmp_path / "labels.csv.failures.jsonl").read_text().splitlines()[0])
    assert failure["path"].endswith("reports.jsonl:2001") and "radiology report stays under" in failure["reason"]
    texts, bad = report_table(table)  # ils build --reports
    assert len(texts) == 2000 and len(bad) == 1


def test_cli_records_a_second_report_of_one_name_and_a_broken_link_as_failures(tmp_path: Path) -> None:
    runner, main = _cli()
    folder = tmp_path / "rep"
    (folder / "sub").mkdir(parents=True)
    (folder / "good.txt").write_text("FINDINGS: Small right pleural effusion.")
    (folder / "sub" / "good.txt").write_text("IMPRESSION: Cardiomegaly.")
    (folder / "other.txt").write_text("FINDINGS: Clear lungs.")
    (folder / "gone.txt").symlink_to(tmp_path / "missing.txt")
    out = tmp_path / "labels.csv"
    result = runner.invoke(main, ["reports", "label", str(folder), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [r["report_id"] for r in rows] == ["good", "other"]  # an id depends on its own file only
    failures = [json.loads(line) for line in
                (tmp_path / "labels.csv.failures.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(f["path"] for f in failures) == sorted([str(folder / "gone.txt"), str(folder / "sub" / "good.txt")])
    clash = next(f for f in failures if f["path"].endswith("good.txt"))
    assert str(folder / "good.txt") in clash["reason"]  # the failure names the first report of that id


@pytest.mark.parametrize(("kind", "head"), [
    ("PNG", b"\x89PNG\r\n\x1a\n"), ("JPEG", b"\xff\xd8\xff\xe0"), ("TIFF", b"II*\x00"), ("TIFF", b"MM\x00*"),
    ("BMP", b"BM\x36\x00\x01\x00\x00\x00\x00\x00"), ("DICOM", b"\x00" * 128 + b"DICM"),
])
def test_an_image_given_as_a_report_is_named_as_an_image(tmp_path: Path, kind: str, head: bytes) -> None:
    """A film given to ``reports label`` (small, or over the size of a report) is named as an image, not a report."""
    from cxrground.reports.readers import MAX_REPORT_SIZE

    runner, main = _cli()
    for name, size in (("small", 200), ("large", 2 * MAX_REPORT_SIZE)):
        film = tmp_path / f"{name}.png"
        film.write_bytes(head + b"\xfe" * size)
        out = tmp_path / f"{name}.csv"
        result = runner.invoke(main, ["reports", "label", str(film), "--out", str(out), "--no-progress"])
        assert result.exit_code == 1, result.output
        failure = json.loads((tmp_path / f"{name}.csv.failures.jsonl").read_text())
        assert failure["path"] == str(film)
        assert failure["reason"].startswith(f"is a {kind} image, not a report (reports are .txt or .xml")
    # a text report that starts with the letters of an image signature is still a report
    (tmp_path / "bm.txt").write_text("BMI 31. FINDINGS: Small left pleural effusion.", encoding="utf-8")
    assert read_report(tmp_path / "bm.txt").report_id == "bm"


def test_cli_llm_structurer_stops_at_once_on_a_server_that_cannot_be_reached(tmp_path: Path) -> None:
    from test_structure_llm import FakeLLM

    runner, main = _cli()
    for k in range(6):
        (tmp_path / f"s{k}.txt").write_text(f"FINDINGS: {TEXT}\n", encoding="utf-8")
    with FakeLLM() as stopped:
        url = stopped.base_url
    out = tmp_path / "labels.csv"
    started = time.perf_counter()
    result = runner.invoke(main, ["reports", "label", str(tmp_path), "--out", str(out), "--structurer", "llm",
                                  "--base-url", url, "--model", "m", "--max-retries", "1", "--concurrency", "1",
                                  "--no-progress"])
    assert result.exit_code == 1 and time.perf_counter() - started < 10, result.output
    assert f"the LLM structurer stops: cannot reach {url}/chat/completions" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_cli_names_the_first_failure_on_the_console(tmp_path: Path) -> None:
    runner, main = _cli()
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "s1.txt").write_text(f"FINDINGS: {TEXT}\n", encoding="utf-8")
    for command in ("label", "structure"):
        out = tmp_path / "out" / f"{command}.out"
        result = runner.invoke(main, ["reports", command, str(tmp_path), "--out", str(out), "--no-progress"])
        assert result.exit_code == 0, result.output
        assert f"1 failures; failures in {out}.failures.jsonl; first: {tmp_path / 'empty.txt'}: empty file" in \
            result.stderr, result.stderr
