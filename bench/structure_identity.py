"""Output-identity check of the rule structurer: sha256 hashes of everything it and the section choice produce.

Run: ``.venv/bin/python bench/structure_identity.py [--synthetic 400] [--seed 0]``.

Structures the 300 Open-i reports of the pack (``CXRGROUND_PACK``; skipped with a note when missing) and
``--synthetic`` report texts of the generator's report-only route (parsed with
:func:`~cxrground.reports.parse_report_text`, as ``bench/structure.py`` does) under every section policy x
alternatives policy, plus every hand-checked sentence of ``tests/tricky_sentences.py`` (when the tests folder is
there) under every alternatives policy, and prints one sha256 per kind of output: the parsed sections of the
synthetic texts, the section choices (``SectionChoice.to_dict``), the finding rows
(``StructuredReport.finding_rows``, as JSON lines) and the tricky sentences' rows, then one hash over all. A speed
change of the structurer must leave every hash as it was.

Hashes of the code before the speed work of issue 16 (commit abd84ea, seed 0, 400 synthetic reports, pack
cxr-pack-v1): all ``ed51659c4d13f95952b6fbbace1028329280b0ed4f6be23d175a26add8c9d305``. Round 5 of issue 16 then
changed the output on purpose (new rules, the ``hedge`` field, 38 more tricky sentences); the speed work merged onto
it left that output as it was: all ``85d8a00219f0a6c95bf15d586ceb6fe23b19fd9001c561ee4d7d4c0ef77b0de5`` before and
after the merge. A later change of the tricky sentences changes the last hash too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from cxrground.datasets.pack import Pack, PackMissingError
from cxrground.evaluation.report_quality import synthetic_cases
from cxrground.reports import SECTION_POLICIES, make_section_choice, parse_report_text, read_report, select_section
from cxrground.reports.model import Report
from cxrground.reports.structure import ALTERNATIVE_POLICIES, RuleStructurer

TESTS = Path(__file__).resolve().parent.parent / "tests"


def _digest(lines: Iterable[str]) -> tuple[str, int]:
    """(sha256 hex of the newline-joined ``lines``, number of lines)."""
    h, n = hashlib.sha256(), 0
    for line in lines:
        h.update(line.encode("utf-8") + b"\n")
        n += 1
    return h.hexdigest(), n


def _dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True)


def choice_lines(reports: list[Report]) -> list[str]:
    """One JSON line per report and section policy: the chosen section (or null)."""
    out = []
    for policy in SECTION_POLICIES:
        for r in reports:
            choice = select_section(r, policy)
            out.append(_dump([policy, r.report_id, choice.to_dict() if choice else None]))
    return out


def finding_lines(reports: list[Report]) -> list[str]:
    """One JSON line per finding row, for every alternatives policy x section policy x report."""
    out = []
    for alternatives in ALTERNATIVE_POLICIES:
        structurer = RuleStructurer(alternatives=alternatives)
        for policy in SECTION_POLICIES:
            for r in reports:
                choice = select_section(r, policy)
                if choice is None:
                    continue
                rows = structurer.structure(r.report_id, choice).finding_rows()
                out.extend(_dump([alternatives, policy, row]) for row in rows)
    return out


def tricky_sentences() -> list[str]:
    """Every sentence of ``tests/tricky_sentences.py`` (none when the file is not there)."""
    if not (TESTS / "tricky_sentences.py").is_file():
        return []
    sys.path.insert(0, str(TESTS))
    import tricky_sentences as tricky  # type: ignore[import-not-found]

    rows = [*tricky.TRICKY, *tricky.LOOKALIKES, *tricky.BROAD]
    return [sentence for _kind, sentence, _expected in rows] + list(tricky.ALTERNATIVES_PRESENT)


def tricky_lines() -> list[str]:
    """Finding rows of every hand-checked sentence as a one-sentence findings section, for every alternatives
    policy."""
    out = []
    for alternatives in ALTERNATIVE_POLICIES:
        structurer = RuleStructurer(alternatives=alternatives)
        for n, sentence in enumerate(tricky_sentences()):
            choice = make_section_choice("findings", sentence)
            if choice is not None:
                rows = structurer.structure(f"tricky-{n}", choice).finding_rows()
                out.extend(_dump([alternatives, row]) for row in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", type=int, default=400, help="synthetic report texts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    try:
        iu = [read_report(p) for p in Pack().iu_report_paths()]
    except PackMissingError as exc:
        iu = []
        print(f"IU reports skipped: {exc}")
    synth = [parse_report_text(c.text, c.report_id) for c in synthetic_cases(args.synthetic, seed=args.seed)]

    parts = {
        "synthetic parsed sections": [_dump([r.report_id, r.format, r.sections]) for r in synth],
        "IU section choices": choice_lines(iu),
        "synthetic section choices": choice_lines(synth),
        "IU finding rows": finding_lines(iu),
        "synthetic finding rows": finding_lines(synth),
        "tricky sentence rows": tricky_lines(),
    }
    total = hashlib.sha256()
    print(f"{len(iu)} IU reports, {len(synth)} synthetic reports (seed {args.seed}), "
          f"{len(SECTION_POLICIES)} section x {len(ALTERNATIVE_POLICIES)} alternatives policies")
    for name, lines in parts.items():
        digest, n = _digest(lines)
        total.update(digest.encode())
        print(f"{name:<28} {n:6d} lines  sha256 {digest}")
    print(f"{'all':<28} {'':12} sha256 {total.hexdigest()}")


if __name__ == "__main__":
    main()
