"""The LLM structurer's prompt and plumbing on the hand-checked tricky sentences, through the mock OpenAI server.

The scripted "model" behind the mock server reads the numbered section of each request, looks the sentences up
in :data:`tricky_sentences.TRICKY` and answers with the expected findings (step 1) and the expected labels
(step 2). The point is the prompt and the plumbing, not a model's intelligence: the test checks that the
prompt carries the guidance for each tricky class, that every request holds the numbered sentences, and
that the answers come back through sentence numbers, location mapping, defaults and the report-level rules
as the expected findings, also for a merged findings + impression section.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cxrground.reports import make_section_choice, parse_numbered, parse_report_text
from cxrground.reports.structure import LLMStructurer, load_prompt, structure_reports, structure_section
from cxrground.reports.structure.llm import STRUCTURE_PROMPT
from cxrground.testing.mock_server import MockServer
from cxrground.vocab import LESIONS
from tricky_sentences import BOTH, BROAD, LOOKALIKES, MIMIC_STYLE, ROUND5, TRICKY

#: Phrases the structuring prompt must hold for each class of tricky sentence.
GUIDANCE: dict[str, tuple[str, ...]] = {
    "negation": ("explicit negation", '"no effusion or pneumothorax" makes both `absent`', "no change in",
                 "interval clearing of", '"no pneumothorax, small right pleural effusion" has a `present` effusion',
                 "does not reach back across a comma that opens a new subject"),
    "hedge": ("NEVER `absent`", "raises concern for", "please correlate clinically for", "would be a consideration",
              "difficult to completely exclude", "unlikely", '"versus" on either side of the term',
              'what "with" attaches to it', '"favor"', '"question"', '"more likely than"',
              '"the cardiac silhouette is borderline in size"', "A hedged EXPLANATION of a finding"),
    "alternatives": ('"or", "/", "and/or" or "versus"', "one entry per alternative, each `uncertain`",
                     'a comma series that ends with "or"'),
    "laterality": ("small right and moderate left pleural", '"Left greater than right"', '"adjacent"',
                   "left lower lobe is clear", "Never copy a location from another sentence",
                   "compressive, passive or relaxation atelectasis", '"Behind the heart"'),
    "lookalike": ("soft-tissue or chest-wall edema", "compression collapse of a vertebral body",
                  "radiation pneumonitis or radiation fibrosis", "bronchovascular crowding"),
    "history": ("history of pneumonia", "describe the past, not this image: no entry"),
    "recommendation": ("to exclude an underlying mass", "document resolution of the pneumonia",
                       "further evaluation of the nodule"),
    "splitting": ("numbered sentences",),
}
#: Phrases the structuring prompt must hold for the decisions the broad phrase set (:data:`tricky_sentences.BROAD`)
#: records where ILS.md §7 is silent.
BROAD_GUIDANCE: tuple[str, ...] = (
    '"partially resolved"', '"has not resolved"', '"near complete resolution of"', '"is not favored"',
    '"it is unclear whether there is ..."', '"in the appropriate clinical setting"', "cephalization",
    "Kerley B lines", '"CHF"', '"Air bronchograms"', '"fluid in the right minor fissure"', '"parapneumonic"',
    '"sequela of prior infection"', "Alternatives after \"adjacent\" share that location",
)
#: Phrases the structuring prompt must hold for round 5's rules (:data:`tricky_sentences.ROUND5`) and hedge grades.
ROUND5_GUIDANCE: tuple[str, ...] = (
    '"have resolved" / "have cleared" negates its whole subject', '"heart size is enlarged, right effusion has '
    'resolved" only the effusion', "are extent words", "diffuse right lower lobe airspace opacity",
    'A location across "with" belongs to a finding only', "what an earlier examination showed is history",
    '"on the prior study the right effusion was larger"', "de-identification blank", '"left perihilar upper lobe"',
    "`hedge`", '"most suggestive of"', "for each member of alternatives", "adjacent atelectasis\" gives the "
    "atelectasis `right hemidiaphragm`",
)
_EXPECTED = {" ".join(s.split()): (kind, expected)
             for kind, s, expected in TRICKY + LOOKALIKES + BROAD + ROUND5 + MIMIC_STYLE}
#: Broad rows the scripted model can answer through the LLM path: a non-target finding outside the lungs (no
#: labels: "CHF") has no lung default there, so those rows are left to the rule test.
_BROAD_LLM = [row for row in BROAD if all(labels for _, _, labels in row[2])]


def _entity(name: str) -> tuple[str, str | None]:
    """(entity phrase, lesion or None) of an expected row's first element."""
    return (name, name) if name in LESIONS else (name, None)


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model: step 1 from the table by sentence text, step 2 from the labels carried as phrases."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if system.startswith("# ILS report structuring"):
        assert system == load_prompt(STRUCTURE_PROMPT).text
        content = user.split("\n", 1)[1]
        numbered = parse_numbered(content)
        findings = []
        # a table row may span several sentences (one finding per sentence); a request may hold several rows
        k = 0
        while k < len(numbered):
            for n in range(len(numbered) - k, 0, -1):
                text = " ".join(t for _, t in numbered[k:k + n])
                if text in _EXPECTED:
                    break
            else:
                raise AssertionError(f"sentence not in the table: {numbered[k][1]!r}")
            for j, (name, assertion, labels) in enumerate(_EXPECTED[text][1]):
                entity, lesion = _entity(name)
                phrases = [] if labels in (BOTH, ("heart",)) else [" and ".join(labels)]
                findings.append({"entity": entity, "sent_idx": numbered[min(k + j, k + n - 1)][0],
                                 "assertion": assertion, "lesion": lesion, "location_phrases": phrases})
            k += n
        return {"findings": findings}
    items = json.loads(user)
    return {"mappings": [{"id": item["id"], "labels": item["location_phrases"][0].split(" and ")} for item in items]}


@pytest.fixture
def server():
    with MockServer(lambda body: json.dumps(_answer(body)), keep_bodies=True) as srv:
        yield srv


def _read(rep) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in rep.findings]


def test_prompt_carries_guidance_for_every_tricky_class() -> None:
    text = " ".join(load_prompt(STRUCTURE_PROMPT).text.split())
    assert {k for k, _, _ in TRICKY} <= set(GUIDANCE)
    for kind, phrases in GUIDANCE.items():
        for phrase in phrases:
            assert phrase in text, (kind, phrase)
    assert "findings+impression" in text and "{{" not in text
    assert all(f"`{lesion}`" in text for lesion in LESIONS)


def _run_rows(server: MockServer, rows: list, prefix: str) -> list:
    """Structure each row's sentence as a findings section through the scripted model; check every row's findings
    and return the structured reports."""
    llm = LLMStructurer(server.base_url, "scripted", concurrency=4, max_retries=0)
    reports = [parse_report_text(f"FINDINGS: {sentence}\n", f"{prefix}{i}") for i, (_, sentence, _) in enumerate(rows)]
    done, failed = structure_reports(reports, llm, progress=False)
    assert not failed and not llm.rejections and len(done) == len(rows)
    for rep, (kind, sentence, expected) in zip(done, rows, strict=True):
        assert _read(rep) == expected, (kind, sentence)
        assert all(f.source == "llm:scripted" for f in rep.findings)
    return done


def test_llm_structurer_on_the_tricky_sentences(server: MockServer) -> None:
    _run_rows(server, TRICKY, "t")
    # every structuring request carried its numbered section
    first = [b for b in server.bodies if b["messages"][0]["content"].startswith("# ILS report structuring")]
    assert len(first) == len(TRICKY)
    assert all(b["messages"][1]["content"].startswith("Report section (findings):\n(1) ") for b in first)


def test_prompt_carries_the_broad_set_decisions() -> None:
    text = " ".join(load_prompt(STRUCTURE_PROMPT).text.split())
    for phrase in BROAD_GUIDANCE:
        assert phrase in text, phrase


def test_llm_structurer_on_the_broad_set(server: MockServer) -> None:
    assert len(_BROAD_LLM) >= len(BROAD) - 5
    _run_rows(server, _BROAD_LLM, "b")


def test_llm_structurer_on_a_merged_section(server: MockServer) -> None:
    """Findings and impression in one request, numbered on; the impression's repeats count once, the findings
    sentence keeps its index and becomes present because the impression states it plainly."""
    report = parse_report_text("FINDINGS: Possible small left effusion with adjacent atelectasis.\n\n"
                               "IMPRESSION: Small left pleural effusion. The effusion is unchanged in size.\n", "m1")
    llm = LLMStructurer(server.base_url, "scripted", max_retries=0)
    done, failed = structure_reports([report], llm, progress=False, sections="findings+impression")
    assert not failed
    (rep,) = done
    assert rep.section.name == "findings+impression"
    assert [(f.sent_idx, f.lesion, f.assertion, f.reported_location) for f in rep.findings] == [
        (1, "effusion", "present", ("left lung",)),
        (1, "atelectasis", "uncertain", ("left lung base",)),
    ]
    user = next(b for b in server.bodies if b["messages"][0]["content"].startswith("# ILS report"))["messages"][1]
    assert user["content"] == ("Report section (findings+impression):\n(1) Possible small left effusion with adjacent "
                               "atelectasis. (2) Small left pleural effusion. (3) The effusion is unchanged in size.")


def test_single_sentence_sections_match_the_table_through_the_plain_api(server: MockServer) -> None:
    llm = LLMStructurer(server.base_url, "scripted", max_retries=0)
    _, sentence, expected = next(row for row in TRICKY if row[0] == "history" and row[2])
    section = make_section_choice("findings", sentence)
    assert section is not None
    assert _read(llm.structure("h", section)) == expected


def test_llm_structurer_keeps_lookalikes_out_of_the_lesions(server: MockServer) -> None:
    llm = LLMStructurer(server.base_url, "scripted", concurrency=4, max_retries=0)
    reports = [parse_report_text(f"FINDINGS: {s}\n", f"l{i}") for i, (_, s, _) in enumerate(LOOKALIKES)]
    done, failed = structure_reports(reports, llm, progress=False)
    assert not failed and len(done) == len(LOOKALIKES)
    for rep, (_, sentence, expected) in zip(done, LOOKALIKES, strict=True):
        assert all(f.lesion is None for f in rep.findings), sentence
        assert [(f.entity.lower(), f.assertion) for f in rep.findings] == [(e, a) for e, a, _ in expected], sentence


def test_prompt_carries_the_round5_rules() -> None:
    text = " ".join(load_prompt(STRUCTURE_PROMPT).text.split())
    for phrase in ROUND5_GUIDANCE:
        assert phrase in text, phrase


def test_llm_structurer_on_the_round5_sentences(server: MockServer) -> None:
    _run_rows(server, ROUND5, "r")


def test_llm_structurer_on_the_mimic_style_sentences(server: MockServer) -> None:
    _run_rows(server, MIMIC_STYLE, "m")


def test_pointing_back_sentence_takes_the_previous_location_on_the_llm_path() -> None:
    """The model gives the second sentence's atelectasis no location (as the prompt tells it: never copy one from
    another sentence); the report-level rule places it where the sentence before placed its opacity."""
    answer = {"findings": [
        {"entity": "opacity", "sent_idx": 1, "assertion": "present", "lesion": "opacity",
         "location_phrases": ["left base"], "hedge": None},
        {"entity": "atelectasis", "sent_idx": 2, "assertion": "uncertain", "lesion": "atelectasis",
         "location_phrases": [], "hedge": "likely"},
    ]}

    def reply(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"].startswith("# ILS report structuring"):
            return json.dumps(answer)
        return json.dumps({"mappings": [{"id": item["id"], "labels": ["left lung base"]}
                                        for item in json.loads(body["messages"][1]["content"])]})

    with MockServer(reply) as srv:
        llm = LLMStructurer(srv.base_url, "scripted", max_retries=0)
        section = make_section_choice("findings", "There is a bandlike opacity at the left base. This likely "
                                                  "represents atelectasis.")
        assert section is not None
        rep = structure_section(llm, "p", section)  # the report-level rules, as every batch path applies them
    assert [(f.lesion, f.assertion, f.reported_location, f.hedge) for f in rep.findings] == [
        ("opacity", "present", ("left lung base",), None),
        ("atelectasis", "uncertain", ("left lung base",), "likely"),
    ]


def test_a_sided_lung_clear_except_for_gives_its_side_on_the_llm_path() -> None:
    """The model maps "basilar" to both bases, as the location prompt says for a phrase without a side; the
    report-level rule keeps the side of "the left lung is clear except for"."""
    answer = {"findings": [{"entity": "atelectasis", "sent_idx": 1, "assertion": "present", "lesion": "atelectasis",
                            "location_phrases": ["basilar"], "hedge": None}]}

    def reply(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"].startswith("# ILS report structuring"):
            return json.dumps(answer)
        return json.dumps({"mappings": [{"id": item["id"], "labels": ["right lung base", "left lung base"]}
                                        for item in json.loads(body["messages"][1]["content"])]})

    with MockServer(reply) as srv:
        llm = LLMStructurer(srv.base_url, "scripted", max_retries=0)
        section = make_section_choice("findings", "The left lung is clear except for minimal basilar atelectasis.")
        assert section is not None
        rep = structure_section(llm, "p", section)
    assert [(f.lesion, f.reported_location) for f in rep.findings] == [("atelectasis", ("left lung base",))]
