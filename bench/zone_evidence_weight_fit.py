"""Fit the position-prior zone readers' evidence weight ``w`` on the zones the pack's case notes name; rule fixed in
``bench/records/zone_evidence_weight_preregistration.md``.

Films: the COVID-19 rows of ``zone_prior_v3``'s training table (shippable licence, no Brixia score, no patient with
a Brixia-scored film). Zone truth: the Brixia zones that a positive lung-lesion finding of the film's notes names
(shipped rule structurer). Score: ``P_z + w·E_z`` as the readers compute it. Prints the pooled within-film AUROC
(named above not named) for each ``w`` of the grid and the chosen one. No Brixia score is read.

Run: ``CXRGROUND_PACK=… OMP_NUM_THREADS=1 PYTHONPATH=src:bench python bench/zone_evidence_weight_fit.py
[--from-table CSV] [--lungs NAME|FILE]`` (the table of ``bench/zone_prior_v2_fit.py --reader zone_prior_v3 --table
CSV``; without it the films are read again, about 2 minutes, through ``--lungs``: by default ``zone_prior_v3``'s
lungs, ``lung_unet_v2``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from fit_lungs import add_lungs_option, lung_segmenter, resolve_lungs
from zone_prior_v2_fit import LUNGS, Row, check_table, read_rows, read_table, training_films
from zones_command import within_film_auroc

from cxrground.datasets.pack import Pack
from cxrground.ils.zone_map import brixia_zones
from cxrground.lesions.zone_prior import EVIDENCE_WEIGHT, ZonePrior, standardise
from cxrground.lesions.zone_severity import logit
from cxrground.reports import make_section_choice
from cxrground.reports.structure import RuleStructurer
from cxrground.vocab.lesions import LUNG_LESIONS

GRID = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
def named_zones(notes: str, structurer: RuleStructurer) -> np.ndarray:
    """Brixia zones A–F that a positive lung-lesion finding of ``notes`` names."""
    section = make_section_choice("findings", notes)
    if section is None:
        return np.zeros(6, bool)
    labels = [lab for f in structurer.structure("notes", section).findings
              if f.lesion in LUNG_LESIONS and f.presence == "positive" for lab in f.reported_location]
    named = set(brixia_zones(labels))
    return np.array([z in named for z in "ABCDEF"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from-table", type=Path, default=None)
    add_lungs_option(parser, LUNGS["zone_prior_v3"], "the shipped zone_prior_v3")
    args = parser.parse_args()
    segmenter = lung_segmenter(resolve_lungs(parser, args.lungs))
    if args.from_table:
        check_table(parser, args.from_table, args.lungs, segmenter.identity()["sha256"])
    pack = Pack()
    notes = {r.image_path.name: r.notes for r in pack.cohen()}
    rows: list[Row] = read_table(args.from_table) if args.from_table else read_rows(
        [f for f in training_films(pack) if f[2] == "covid"], segmenter)[0]
    rows = [r for r in rows if r.group == "covid"]
    structurer = RuleStructurer()
    truth = np.array([named_zones(notes.get(r.image) or "", structurer) for r in rows])
    sim, share = np.array([r.sim for r in rows]), np.array([r.share for r in rows])
    position = np.log(6.0 * ZonePrior.load().vector)
    evidence = 0.5 * (standardise(logit(sim)) + standardise(share))
    mixed = int(sum(t.any() and not t.all() for t in truth))
    print(f"{len(rows)} COVID-19 films with readings; {int(truth.any(axis=1).sum())} with a named zone; "
          f"{mixed} mixed (named and not named zones)")
    results = []
    for w in GRID:
        auc, films = within_film_auroc(truth, position[None, :] + w * evidence)
        results.append((auc, w))
        print(f"w = {w:<6g} within-film AUROC {auc:.3f} ({films} mixed films)")
    best = max(a for a, _ in results)
    chosen = min((w for a, w in results if a == best), key=lambda w: abs(w - EVIDENCE_WEIGHT))
    print(f"chosen w = {chosen:g} (shipped {EVIDENCE_WEIGHT:g})")


if __name__ == "__main__":
    main()
