"""Report-structuring benchmark: speed and accuracy of the rule structurer (ILS §7).

Run: ``.venv/bin/python bench/structure.py [--synthetic 200] [--full-studies 0] [--repeat 20] [--errors 0]``.

Prints
1. reports/s on one core (single process; CPU time) of :class:`RuleStructurer` on the 300 Open-i reports of
   the pack (repeated ``--repeat`` times), structuring only (sections chosen beforehand) and with the section
   choice of each section policy; then the same on synthetic report texts (parse + choose + structure, and
   structure only);
2. accuracy against the synthetic truth on ``--synthetic`` reports from the generator's report-only route
   (no pixels; see :mod:`cxrground.evaluation.report_quality`), per lesion: precision / recall of present
   findings, assertion accuracy (tentative = uncertain, negated = absent), location-label exact-match rate;
   ``--full-studies N`` adds N complete ``generate_study`` studies (about 0.2 s each) as a cross-check;
3. agreement with the human-coded MeSH major terms of the 300 IU reports
   (:mod:`cxrground.evaluation.report_quality`: term mapping ``MESH_TO_LESION``, sides ``mesh_sides``): macro F1
   over the lesions with MeSH-positive reports and side agreement, for every section policy
   (``findings`` = ILS §6, ``impression``, ``findings+impression``) and alternatives policy (``uncertain`` =
   ILS.md §7.1, ``present``), counting present + uncertain findings (``positive``), present findings only
   (``present``), or present findings and those hedged with a ``likely``-grade hedge (``likely``), on the ``dev``
   half, the ``held-out`` half (fixed salted-hash halves; rounds 1-4 read dev errors only; round 5 read the
   held-out disagreements too, so since then neither half is unseen) and all reports; then per-lesion precision /
   recall / F1 on all reports for findings+impression, and how often MeSH codes a lesion the report only hedges,
   per hedge grade. ``--errors N`` prints N disagreements of the dev half.
   ``--llm-base-url URL --llm-model M [--llm-cache FILE]`` adds the LLM structurer (any OpenAI-compatible server,
   e.g. a local vLLM) on the findings+impression policy.
Real-data rows need the pack (``CXRGROUND_PACK`` or ``../shared/data/cxr-pack-v1``) and are skipped with a
note when it is missing.
"""

from __future__ import annotations

import argparse
import time

from cxrground.datasets.pack import Pack, PackMissingError
from cxrground.datasets.synthetic import generate_study
from cxrground.evaluation.report_quality import (
    MESH_COUNTS,
    MESH_SPLITS,
    cases_from_truth,
    format_scores,
    hedge_coding,
    mesh_cases,
    score_mesh_cases,
    score_synthetic,
    synthetic_cases,
)
from cxrground.reports import MERGED_SECTION, SECTION_POLICIES, choose_section, parse_report_text, read_report
from cxrground.reports import select_section as select
from cxrground.reports.structure import ALTERNATIVE_POLICIES, RuleStructurer

SYNTH_COLUMNS = ["n_true", "n_pred", "precision", "recall", "n_assert", "assertion_acc", "n_loc", "location_exact"]
MESH_COLUMNS = ["n_true", "n_pred", "tp", "precision", "recall", "f1", "side_n", "side_exact"]


def rate(fn, n_items: int, repeat: int) -> tuple[float, float]:
    """(items per CPU second, items per wall second) of ``fn`` over ``repeat`` runs after a warm-up."""
    fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        fn()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return n_items * repeat / cpu, n_items * repeat / wall


def row(name: str, rates: tuple[float, float]) -> None:
    print(f"{name:<76} {rates[0]:9.0f} reports/s/core  ({rates[1]:.0f}/s wall)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", type=int, default=200, help="synthetic reports for the accuracy table")
    parser.add_argument("--full-studies", type=int, default=0, help="complete generate_study studies (slow)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--errors", type=int, default=0, help="print this many synthetic and dev-half MeSH "
                        "disagreements")
    parser.add_argument("--llm-base-url", help="also score the LLM structurer behind this OpenAI-compatible API root")
    parser.add_argument("--llm-model", help="model name for --llm-base-url")
    parser.add_argument("--llm-cache", help="SQLite response cache of the LLM structurer (reruns make no request)")
    args = parser.parse_args()
    rules = RuleStructurer()

    print("== speed (single process) ==")
    try:
        reports = [read_report(p) for p in Pack().iu_report_paths()]
    except PackMissingError as exc:
        reports = []
        print(f"IU reports skipped: {exc}")
    if reports:
        sections = [(r.report_id, s) for r in reports if (s := choose_section(r)) is not None]
        row(f"rules, {len(sections)} IU reports x{args.repeat}, structure only",
            rate(lambda: [rules.structure(rid, s) for rid, s in sections], len(sections), args.repeat))

        for policy in SECTION_POLICIES:
            def choose_and_structure(policy: str = policy) -> None:
                for r in reports:
                    s = select(r, policy)
                    if s is not None:
                        rules.structure(r.report_id, s)

            row(f"rules, {len(reports)} IU reports x{args.repeat}, section choice ({policy}) + structure",
                rate(choose_and_structure, len(reports), args.repeat))

    start = time.perf_counter()
    cases = list(synthetic_cases(max(args.synthetic, 1), seed=args.seed))
    gen = time.perf_counter() - start
    texts = [(c.report_id, c.text) for c in cases]
    synth_sections = [(rid, s) for rid, t in texts if (s := choose_section(parse_report_text(t, rid))) is not None]
    repeat = max(1, args.repeat * 300 // max(len(texts), 1))
    row(f"rules, {len(synth_sections)} synthetic reports x{repeat}, structure only",
        rate(lambda: [rules.structure(rid, s) for rid, s in synth_sections], len(synth_sections), repeat))

    def parse_choose_structure() -> None:
        for rid, t in texts:
            s = choose_section(parse_report_text(t, rid))
            if s is not None:
                rules.structure(rid, s)

    row(f"rules, {len(texts)} synthetic reports x{repeat}, parse + section choice + structure",
        rate(parse_choose_structure, len(texts), repeat))
    print(f"(report-only synthetic generation: {1000 * gen / len(cases):.2f} ms/report)")

    print(f"\n== accuracy vs synthetic truth: {len(cases)} report-only reports, seed {args.seed} ==")
    scores = score_synthetic(rules, cases)
    print(format_scores(scores, SYNTH_COLUMNS))
    print(f"assertion confusion (truth->pred): {scores['confusion']}; truth findings not placed in a sentence: "
          f"{scores['unplaced_truth']}")
    for err in scores["errors"][: args.errors]:
        print("  ", err)
    if args.full_studies > 0:
        start = time.perf_counter()
        studies = [generate_study(args.seed, i) for i in range(args.full_studies)]
        full = cases_from_truth([s.truth for s in studies], {s.truth.study_id: s.report for s in studies})
        print(f"\n== accuracy vs synthetic truth: {len(full)} full generate_study studies "
              f"({time.perf_counter() - start:.1f} s to generate) ==")
        print(format_scores(score_synthetic(rules, full), SYNTH_COLUMNS))

    if reports:
        mesh_report(reports, args.errors)
        if args.llm_base_url:
            llm_report(reports, args.llm_base_url, args.llm_model or "", args.llm_cache)


def llm_report(reports: list, base_url: str, model: str, cache: str | None) -> None:
    """MeSH agreement of the LLM structurer on the findings+impression policy."""
    from cxrground.reports.structure import LLMStructurer

    llm = LLMStructurer(base_url, model, cache=cache, concurrency=8)
    cases = mesh_cases(llm, reports, MERGED_SECTION)
    print(f"\n== LLM structurer {model} ({base_url}), {MERGED_SECTION}: {len(cases)} reports structured, "
          f"{llm.stats['failures']} failed, {len(llm.rejections)} out-of-vocabulary values rejected ==")
    for count in MESH_COUNTS:
        scores = [score_mesh_cases(cases, s, count) for s in (*MESH_SPLITS, None)]
        print(f"counting {count}: macro F1 " + ", ".join(
            f"{s or 'all'} {_cell(sc['macro_f1'])}" for s, sc in zip((*MESH_SPLITS, None), scores, strict=True))
            + f"; side {_cell(scores[-1]['side_exact'])} ({scores[-1]['side_n']})")
        print(format_scores(scores[-1], MESH_COLUMNS))


def _cell(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.3f}"


def mesh_report(reports: list, n_errors: int) -> None:
    """Print the MeSH agreement tables (see the module docstring)."""
    splits = (*MESH_SPLITS, None)
    print(f"\n== agreement with IU MeSH major terms: {len(reports)} reports; halves by salted hash: "
          + ", ".join(f"{s} {sum(1 for c in mesh_cases(RuleStructurer(), reports, 'findings') if c.split == s)}"
                      for s in MESH_SPLITS) + " ==")
    print("macro F1 over the lesions with MeSH-positive reports (opacity incl. attributed observations); "
          "side = exact MeSH side agreement of true positives")
    header = f"{'sections':<21}{'alternatives':<13}"
    for count in MESH_COUNTS:
        header += "".join(f"{count + ' ' + (s or 'all'):>18}" for s in splits) + f"{'side ' + count:>15}"
    print(header)
    cases_by: dict[tuple[str, str], list] = {}
    for alternatives in ALTERNATIVE_POLICIES:
        structurer = RuleStructurer(alternatives=alternatives)
        for policy in SECTION_POLICIES:
            cases = cases_by[(policy, alternatives)] = mesh_cases(structurer, reports, policy)
            line = f"{policy:<21}{alternatives:<13}"
            for count in MESH_COUNTS:
                scores = [score_mesh_cases(cases, s, count) for s in splits]
                line += "".join(f"{_cell(sc['macro_f1']):>18}" for sc in scores)
                line += f"{_cell(scores[-1]['side_exact']):>10} ({scores[-1]['side_n']})"
            print(line)
    for alternatives in ALTERNATIVE_POLICIES:
        for count in MESH_COUNTS:
            scores = score_mesh_cases(cases_by[(MERGED_SECTION, alternatives)], None, count)
            print(f"\n-- {MERGED_SECTION}, alternatives {alternatives}, counting {count} findings, all "
                  f"{scores['n_reports']} reports (macro F1 {_cell(scores['macro_f1'])}, lesion field only "
                  f"{_cell(scores['macro_f1_lesion_field'])}) --")
            print(format_scores(scores, MESH_COLUMNS))
    print(f"\n-- hedged-only lesions ({MERGED_SECTION}): how often MeSH codes a lesion the report only hedges, "
          "by hedge grade (the evidence for the 'likely' count) --")
    for alternatives in ALTERNATIVE_POLICIES:
        tally = hedge_coding(cases_by[(MERGED_SECTION, alternatives)])
        print(f"alternatives {alternatives:<10} " + "   ".join(
            f"{grade}: {t['coded']}/{t['n']} coded" for grade, t in tally.items() if t["n"]))
    if n_errors:
        dev = score_mesh_cases(cases_by[(MERGED_SECTION, ALTERNATIVE_POLICIES[0])], "dev", "present")
        print(f"\n-- dev-half disagreements ({MERGED_SECTION}, default alternatives, counting present) --")
        for err in dev["errors"][:n_errors]:
            print(f"{err['kind']:>5} {err['lesion']:<13} {err['report_id']:<8} mesh={err['mesh']} "
                  f"sides truth={err['truth_sides']} pred={err['pred_sides']}")
            for sentence in err["evidence"]:
                print(f"        {sentence}")


if __name__ == "__main__":
    main()
