"""Open-i / IU XML reports: parsing, bad input, batch reading, and the 300 real reports of cxr-pack-v1."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxrground.errors import Failure, ReportError
from cxrground.reports import (
    choose_section,
    list_report_files,
    parse_iu_xml,
    read_iu_xml,
    read_report,
    read_reports,
)

SMALL_XML = """<?xml version="1.0" encoding="utf-8"?>
<eCitation>
   <meta type="rr"/>
   <uId id="CXR9001"/>
   <pmcId id="9001"/>
   <IUXRId id="9001"/>
   <MedlineCitation>
      <Article>
         <Abstract>
            <AbstractText Label="COMPARISON"/>
            <AbstractText Label="INDICATION">Cough, fever</AbstractText>
            <AbstractText Label="FINDINGS">   </AbstractText>
            <AbstractText Label="IMPRESSION">1. Right lower lobe opacity &amp; small effusion. \
2. No pneumothorax.</AbstractText>
         </Abstract>
      </Article>
   </MedlineCitation>
   <MeSH>
      <major>Opacity/lung/base/right</major>
      <major>Pleural Effusion/right/small</major>
      <minor>Pneumonia</minor>
   </MeSH>
   <parentImage id="CXR9001_IM-0001-1001"><caption>PA</caption></parentImage>
   <parentImage id="CXR9001_IM-0001-2001"><caption>Lateral</caption></parentImage>
</eCitation>
"""


def test_parse_small_iu_xml() -> None:
    report = parse_iu_xml(SMALL_XML.encode("utf-8"), source="mem.xml")
    assert report.report_id == "CXR9001"
    assert report.format == "iu_xml"
    assert report.source == "mem.xml"
    # empty COMPARISON and whitespace-only FINDINGS count as absent
    assert report.sections == {
        "indication": "Cough, fever",
        "impression": "1. Right lower lobe opacity & small effusion. 2. No pneumothorax.",
    }
    assert report.findings is None
    assert report.mesh_major == ("Opacity/lung/base/right", "Pleural Effusion/right/small")
    assert report.mesh_minor == ("Pneumonia",)
    assert report.image_ids == ("CXR9001_IM-0001-1001", "CXR9001_IM-0001-2001")
    assert report.metadata == {"pmc_id": "9001", "iuxr_id": "9001"}
    choice = choose_section(report)
    assert choice is not None and choice.name == "impression"
    assert choice.section_content == "(1) Right lower lobe opacity & small effusion. (2) No pneumothorax."
    assert report.to_dict()["mesh_major"] == ["Opacity/lung/base/right", "Pleural Effusion/right/small"]


def test_iu_report_without_findings_or_impression_has_no_choice() -> None:
    impression = "1. Right lower lobe opacity &amp; small effusion. 2. No pneumothorax."
    xml = SMALL_XML.replace(impression, "").encode("utf-8")
    assert choose_section(parse_iu_xml(xml)) is None


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.xml", b"", "empty file"),
        ("blank.xml", b" \n\t\n", "whitespace-only file"),
        ("latin1.xml", SMALL_XML.replace("Cough", "Tos\xe9").encode("latin-1"), "not valid UTF-8: byte 0xe9"),
        ("broken.xml", SMALL_XML.replace("</MeSH>", "").encode("utf-8"), "malformed XML: mismatched tag"),
        ("other.xml", b"<?xml version='1.0'?><html><body/></html>", "root element is <html>"),
        (
            "entities.xml",
            b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><eCitation>&a;</eCitation>',
            "entity declarations are not accepted",
        ),
    ],
)
def test_bad_xml_raises_with_path_and_reason(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ReportError) as info:
        read_report(path)
    assert str(path) in str(info.value)
    assert reason in str(info.value)


def test_non_utf8_offset_is_exact(tmp_path: Path) -> None:
    data = SMALL_XML.encode("utf-8")
    offset = data.index(b"Cough")
    path = tmp_path / "bad.xml"
    path.write_bytes(data[:offset] + b"\xff" + data[offset + 1 :])
    with pytest.raises(ReportError, match=f"byte 0xff at offset {offset} "):
        read_iu_xml(path)


def test_missing_xml_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.xml"
    with pytest.raises(ReportError, match="file does not exist") as info:
        read_iu_xml(path)
    assert str(path) in str(info.value)


def test_xml_content_is_detected_without_xml_suffix(tmp_path: Path) -> None:
    path = tmp_path / "report.dat"
    path.write_text(SMALL_XML, encoding="utf-8")
    assert read_report(path).format == "iu_xml"


def test_read_reports_keeps_every_good_file_and_one_failure_per_bad_file(tmp_path: Path) -> None:
    good_xml = tmp_path / "a.xml"
    good_xml.write_text(SMALL_XML, encoding="utf-8")
    good_txt = tmp_path / "b.txt"
    good_txt.write_text(" FINDINGS:  Lungs are clear.\n", encoding="utf-8")
    empty = tmp_path / "c.txt"
    empty.write_bytes(b"")
    blank = tmp_path / "d.txt"
    blank.write_text("   \n", encoding="utf-8")
    latin = tmp_path / "e.txt"
    latin.write_bytes(b"Lungs \xe9 clear.")
    broken = tmp_path / "f.xml"
    broken.write_text("<eCitation><uId id='x'/>", encoding="utf-8")
    missing = tmp_path / "g.xml"
    good_plain = tmp_path / "h.txt"
    good_plain.write_text("Heart size normal.", encoding="utf-8")
    paths = [good_xml, good_txt, empty, blank, latin, broken, missing, good_plain]

    reports, failures = read_reports(paths, progress=False)

    assert [r.report_id for r in reports] == ["CXR9001", "b", "h"]
    assert len(reports) + len(failures) == len(paths)
    assert [f.path for f in failures] == [str(p) for p in (empty, blank, latin, broken, missing)]
    assert all(isinstance(f, Failure) and f.stage == "reports" and f.error == "ReportError" for f in failures)
    assert [f.reason.split(":")[0] for f in failures] == [
        "empty file",
        "whitespace-only file",
        "not valid UTF-8",
        "malformed XML",
        "file does not exist",
    ]


# ---------------------------------------------------------------------------------------------------
# Real data: the 300 Open-i/IU reports of cxr-pack-v1 (observed: findings 271, impression 297,
# MeSH major 300, 593 major terms, choice findings 271 / impression 26 / none 3).


@pytest.fixture(scope="module")
def iu_reports(pack_dir: Path) -> tuple[list, list]:
    files = list_report_files(pack_dir / "iu_reports")
    assert len(files) == 300
    return read_reports(files, progress=False)


@pytest.mark.pack
def test_all_real_iu_reports_parse(iu_reports: tuple[list, list]) -> None:
    reports, failures = iu_reports
    assert failures == []
    assert len(reports) == 300
    assert len({r.report_id for r in reports}) == 300
    assert all(r.format == "iu_xml" and r.report_id.startswith("CXR") for r in reports)


@pytest.mark.pack
def test_real_iu_section_and_mesh_counts(iu_reports: tuple[list, list]) -> None:
    reports, _ = iu_reports
    with_findings = sum(r.findings is not None for r in reports)
    with_impression = sum(r.impression is not None for r in reports)
    with_mesh = sum(bool(r.mesh_major) for r in reports)
    assert with_findings >= 260
    assert with_impression >= 290
    assert with_mesh >= 295
    assert sum(len(r.mesh_major) for r in reports) >= 550
    assert sum(bool(r.image_ids) for r in reports) >= 280
    choices = [choose_section(r) for r in reports]
    names = [c.name for c in choices if c is not None]
    assert names.count("findings") == with_findings
    assert names.count("impression") >= 20
    assert "last_paragraph" not in names
    assert sum(c is None for c in choices) <= 5


@pytest.mark.pack
def test_real_iu_report_1018_verbatim(pack_dir: Path) -> None:
    report = read_report(pack_dir / "iu_reports" / "1018.xml")
    assert report.report_id == "CXR1018"
    assert report.mesh_major == ("Calcified Granuloma/lung/right/small",)
    assert report.mesh_minor == ()
    assert report.image_ids == ("CXR1018_IM-0014-5001", "CXR1018_IM-0014-6001")
    assert report.findings == (
        "The cardiomediastinal silhouette and pulmonary vasculature are within normal limits. "
        "There is no pneumothorax or pleural effusion. There are no focal areas of consolidation. "
        "There are small calcified granulomata in the right lateral lung."
    )
    assert report.impression == "No acute cardiopulmonary abnormality."
    assert report.indication == "XXXX"
    assert report.comparison == "None available."
    choice = choose_section(report)
    assert choice is not None and choice.name == "findings"
    assert choice.section_content == (
        "(1) The cardiomediastinal silhouette and pulmonary vasculature are within normal limits. "
        "(2) There is no pneumothorax or pleural effusion. (3) There are no focal areas of consolidation. "
        "(4) There are small calcified granulomata in the right lateral lung."
    )
