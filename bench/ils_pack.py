"""ILS build on real images: the COVID-19 collection rows of the pack that have notes, checked against the
radiologists' Brixia zone scores (external check of the grounded locations).

Run: ``.venv/bin/python bench/ils_pack.py [--segmenter masks|unet]``. The notes are short clinical texts,
not full reports; each becomes the study's report. For the 68 rows with both notes and Brixia scores,
a zone (right/left × upper/mid/lower = Brixia A-F) counts as abnormal when the senior reader scored it
> 0, and as *grounded* when a lung-lesion mask of the built dataset covers ≥ 1 % of that ILS zone
(upper zone / mid zone / lung base). The reported locations (text only, no pixels) are scored the same
way for comparison. Prints sensitivity, specificity, accuracy and Cohen's kappa per zone and overall, the
all-zone kappa's 95 % interval from a bootstrap over patients (studies of one patient are resampled together),
and, before any Brixia number, how the positive lung findings fared in Algorithm 1. Then the image checks:
the share of lung-lesion negative pairs (target a lung lesion or the tentative "opacity") that name a zone the
senior scored abnormal (a whole-lung label names its three zones, "lung" all six), by lesion, pair type and kind,
and the same share among the negatives whose zones the junior reader scored 0 (what an image check that agreed
with a radiologist would leave: the two readers' disagreement bounds any check), the median share of each
lung-lesion mask's pixels on the heart outline (the build's) or the mediastinum (per row, the gap between the
lungs), the pairs the build left out by reason (``--synthesizer lesion-unet`` checks pairs against the image), and
the films whose lung-lesion masks cover part of the annotators' "ignore" regions (burned-in arrows, labels, devices).
``--gallery DIR`` writes one PNG overlay per scored study (masks red, heart + mediastinum yellow, the zones the
lung-lesion negatives name green; Brixia scores in the panel). Also printed: the negatives placed away from flagged
zones (``--negative-check``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.datasets.pack import Pack
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.request import PAPER_RULES
from cxrground.ils.tasks import NOT_IN_INDEX, build_tasks
from cxrground.io.masks import decode_rle, read_mask_png
from cxrground.lesions.lesion_zones import mediastinum_mask
from cxrground.vocab.ils_templates import TENTATIVE_WORD
from cxrground.vocab.lesions import LUNG_LESIONS

ZONES = {"A": "right upper zone lung", "B": "right mid zone lung", "C": "right lung base",
         "D": "left upper zone lung", "E": "left mid zone lung", "F": "left lung base"}
COVER = 0.01
#: Brixia zones a location label names.
LABEL_ZONES = {**{label: [z] for z, label in ZONES.items()}, "right apical zone lung": ["A"],
               "left apical zone lung": ["D"], "right lung": ["A", "B", "C"], "left lung": ["D", "E", "F"],
               "lung": list(ZONES)}
#: Patient-grouped bootstrap resamples for the kappa's 95 % interval.
BOOTSTRAP = 2000


def kappa(truth: np.ndarray, pred: np.ndarray) -> float:
    """Cohen's kappa of two binary vectors."""
    po = float((truth == pred).mean())
    pe = float(truth.mean() * pred.mean() + (1 - truth.mean()) * (1 - pred.mean()))
    return (po - pe) / (1 - pe) if pe < 1 else float("nan")


def kappa_ci(truth: np.ndarray, pred: np.ndarray, groups: list[str], resamples: int = BOOTSTRAP,
             seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the all-zone kappa over bootstrap resamples of patients (``groups``: one
    patient per row of ``truth`` / ``pred``, which are studies × zones)."""
    patients = sorted(set(groups))
    rows = {p: [i for i, g in enumerate(groups) if g == p] for p in patients}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        idx = [i for k in rng.integers(0, len(patients), len(patients)) for i in rows[patients[k]]]
        t, m = truth[idx].ravel(), pred[idx].ravel()
        if 0 < t.mean() < 1 and 0 < m.mean() < 1:
            values.append(kappa(t, m))
        else:
            values.append(0.0)  # a constant rater agrees no better than chance
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def scores(truth: np.ndarray, pred: np.ndarray) -> str:
    tp, tn = int((truth & pred).sum()), int((~truth & ~pred).sum())
    sens = tp / max(1, int(truth.sum()))
    spec = tn / max(1, int((~truth).sum()))
    return (f"sens {100 * sens:5.1f}  spec {100 * spec:5.1f}  acc {100 * float((truth == pred).mean()):5.1f}  "
            f"kappa {kappa(truth, pred):5.2f}  (n={truth.size}, abnormal {int(truth.sum())})")


def cohen_ils_dataset(pack: Pack, work: Path, segmenter: str, limit: int | None = None, synthesizer: str = "normative",
                      synthesizer_kwargs: dict[str, Any] | None = None,
                      detector_kwargs: dict[str, Any] | None = None, negative_check: str = "none",
                      negative_exclusion: str = "location", zone_guide: str = IlsConfig().zone_guide,
                      silent_report_negatives: bool = False, global_negatives_need_region: bool = False,
                      rules: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build ``work/dataset`` from the COVID-19 collection rows with notes (the first ``limit``); returns
    ``{study_id: row}``. The notes are the reports; ``segmenter`` masks = the pack's lung masks."""
    rows = [r for r in pack.cohen() if r.notes][:limit]
    work.mkdir(parents=True, exist_ok=True)
    index = work / "index.jsonl"
    ids = {f"s{900000 + i}": r for i, r in enumerate(rows)}
    index.write_text("".join(json.dumps({"image": r.image_path.name, "study_id": sid, "subject_id": r.patient_id,
                                          "report": r.notes, "view": r.view}) + "\n" for sid, r in ids.items()))
    tasks, failures = build_tasks(pack.root / "cohen" / "images", index=index)
    failures = [f for f in failures if not f.reason.startswith(NOT_IN_INDEX)]  # the films without notes: by design
    kwargs = ({"root": str(pack.root / "cohen" / "masks"), "pattern": "{stem}_{name}.png"}
              if segmenter == "masks" else {})
    spec = BackendSpec(segmenter=segmenter, segmenter_kwargs=kwargs, synthesizer=synthesizer,
                       synthesizer_kwargs=synthesizer_kwargs or {}, detector_kwargs=detector_kwargs or {})
    start = time.perf_counter()
    config = IlsConfig(**{"negative_check": negative_check, "negative_exclusion": negative_exclusion,
                          "zone_guide": zone_guide, "silent_report_negatives": silent_report_negatives,
                          "global_negative_needs_region": global_negatives_need_region, **(rules or {})})
    summary = build_dataset(tasks, work / "dataset", config, spec,
                            scan_failures=failures, progress=False,
                            overwrite=True)
    print(f"built {summary.studies_in_dataset} studies / {summary.pairs} pairs from {len(rows)} noted rows "
          f"({summary.failures} failures) in {time.perf_counter() - start:.1f} s, segmenter={segmenter}, "
          f"synthesizer={synthesizer} {synthesizer_kwargs or ''}, detector options {detector_kwargs or 'default'}, "
          f"negative check {negative_check}, negative exclusion {negative_exclusion}, zone guide {config.zone_guide}"
          + (f", rules {rules}" if rules else ""))
    fitted = work / "dataset" / "normative_fitted.json"
    if fitted.is_file():
        meta = json.loads(fitted.read_text())
        trimmed = meta.get("trimmed", {}).get("films", 0)
        print(f"normative model fitted on the build's report-normal studies: {meta['source']}, {meta['films']} films "
              f"({meta['report_normal']} report-normal of {meta['visited']} visited, {trimmed} trimmed, "
              f"trim={meta.get('trimmed', {}).get('mode', 'off')})")
    return ids


def grounding_summary(dataset: Path) -> None:
    """Print how the positive lung findings fared (grounded or why not) and why boxes were stopped (no Brixia)."""
    status: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for unit in sorted((dataset / "units").glob("*.json")):
        for rec in json.loads(unit.read_text()).get("grounding", []):
            if rec.get("lesion") == "cardiomegaly":
                continue
            status[rec["status"] if rec["status"] == "grounded" else f"{rec['status']}:{rec.get('reason')}"] += 1
            failed.update(rec.get("failure_counts", {}))
    print(f"positive lung findings: {dict(sorted(status.items()))}; boxes stopped by: {dict(sorted(failed.items()))}")


def main() -> None:
    from cxrground.ils.config import NEGATIVE_CHECKS, NEGATIVE_EXCLUSIONS, ZONE_GUIDES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segmenter", default="masks", choices=["masks", "unet"],
                        help="masks = the pack's own lung masks; unet = the shipped lung U-Net")
    parser.add_argument("--synthesizer", default="normative", choices=["normative", "pseudo-normal", "lesion-unet"])
    parser.add_argument("--gallery", type=Path, default=None, help="write one PNG overlay per scored study here")
    parser.add_argument("--band", type=float, default=None, help="normative: top of the normal band (robust SDs)")
    parser.add_argument("--synthesizer-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="more synthesizer options, e.g. model=shipped or shrink=false (normative)")
    parser.add_argument("--detector-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="built-in detector options, e.g. strength_mid=0.26 (the pre-issue-14 calibration)")
    parser.add_argument("--negative-check", default="none", choices=list(NEGATIVE_CHECKS),
                        help="image check of negatives (ils build --negative-check)")
    parser.add_argument("--negative-exclusion", default="location", choices=list(NEGATIVE_EXCLUSIONS),
                        help="where a reported finding keeps lung-lesion negatives away "
                             "(ils build --negative-exclusion)")
    parser.add_argument("--zone-guide", default=IlsConfig().zone_guide, choices=list(ZONE_GUIDES),
                        help="zone reader guiding lung-lesion masks (ils build --zone-guide; none: Algorithm 1 "
                             "alone)")
    parser.add_argument("--silent-report-negatives", action="store_true",
                        help="notes that say nothing about the film still give lung negatives (ils build "
                             "--silent-report-negatives)")
    parser.add_argument("--global-negatives-need-region", action="store_true",
                        help="a global lung negative only where a basic one could be placed (ils build "
                             "--global-negatives-need-region)")
    parser.add_argument("--paper-rules", action="store_true",
                        help="ILS.md read literally, as `ils build --paper-rules` (zone guide none, silent-report "
                             "negatives, grounded location from the boxes, the CTR negative for a prominent heart)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N noted rows (exploration)")
    args = parser.parse_args()
    pack = Pack()
    work = args.out or Path(tempfile.mkdtemp(prefix="cxrground-ils-pack-"))
    kwargs = {"band": args.band} if args.band is not None else {}
    kwargs.update(opt.split("=", 1) for opt in args.synthesizer_opt)
    detector = dict(opt.split("=", 1) for opt in args.detector_opt)
    ids = cohen_ils_dataset(pack, work, args.segmenter, limit=args.limit, synthesizer=args.synthesizer,
                            synthesizer_kwargs=kwargs, detector_kwargs=detector, negative_check=args.negative_check,
                            negative_exclusion=args.negative_exclusion, zone_guide=args.zone_guide,
                            silent_report_negatives=args.silent_report_negatives,
                            global_negatives_need_region=args.global_negatives_need_region,
                            rules=PAPER_RULES if args.paper_rules else None)
    data = json.loads((work / "dataset" / "mimic_ils_instruction_answer.json").read_text())
    studies = {k: v for split in data.values() for k, v in split.items()}
    anatomy = {json.loads(line)["study"]: json.loads(line)
               for line in (work / "dataset" / "anatomy.jsonl").read_text().splitlines()}
    grounding_summary(work / "dataset")
    truth_rows, mask_rows, text_rows, patients = [], [], [], []
    neg_total, neg_abnormal, centre_shares = 0, 0, []
    neg_groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # group -> [negatives, senior-abnormal]
    junior_kept = [0, 0]
    images = {sid: rec.image_path for sid, rec in ids.items()}
    for sid, rec in ids.items():
        if rec.brixia is None or sid not in anatomy:
            continue
        anat = anatomy[sid]
        shape = (anat["height"], anat["width"])
        lesion = np.zeros(shape, bool)
        reported: set[str] = set()
        right, left = decode_rle(anat["right_lung"], shape), decode_rle(anat["left_lung"], shape)
        centre = mediastinum_mask(right, left)
        if anat.get("heart"):
            centre |= decode_rle(anat["heart"], shape)
        pairs = studies.get(sid, {}).get("instruction_answer_pairs", {})
        seen_masks: set[str] = set()
        for p in pairs.get("positive_pairs", []):
            if p["target"] == "cardiomegaly":
                continue
            m = read_mask_png(work / "dataset" / "lesion_mask" / p["seg_mask_path"], shape)
            lesion |= m
            reported |= set(p["reported_location"])
            if p["target"] in LUNG_LESIONS and p["seg_mask_path"] not in seen_masks and m.any():
                seen_masks.add(p["seg_mask_path"])
                centre_shares.append(float((m & centre).sum()) / float(m.sum()))
        named = np.zeros(shape, bool)
        for n in pairs.get("negative_pairs", []):
            if n["target"] in LUNG_LESIONS or n["target"] == TENTATIVE_WORD:
                zones = {z for lab in n["location"] for z in LABEL_ZONES.get(lab, [])}
                neg_total += 1
                wrong = any(rec.brixia.senior[z] > 0 for z in zones)
                neg_abnormal += wrong
                for group in (f"lesion {n['target']}", f"type {n['type']}", f"kind {n.get('kind', '-')}"):
                    neg_groups[group][0] += 1
                    neg_groups[group][1] += wrong
                if not any(rec.brixia.junior[z] > 0 for z in zones):  # a check as good as the junior reader
                    junior_kept[0] += 1
                    junior_kept[1] += wrong
                for z in zones:
                    named |= decode_rle(anat["locations"][ZONES[z]], shape)
        if args.gallery is not None:
            _gallery_panel(args.gallery, sid, rec, images[sid], lesion, centre, pairs, named)
        t, m, x = [], [], []
        for z, label in ZONES.items():
            zone = decode_rle(anat["locations"][label], shape)
            t.append(rec.brixia.senior[z] > 0)
            m.append(bool(zone.any()) and (lesion & zone).sum() >= COVER * zone.sum())
            side = label.split(" ")[0]
            x.append(label in reported or f"{side} lung" in reported)
        patients.append(rec.patient_id)
        truth_rows.append(t)
        mask_rows.append(m)
        text_rows.append(x)
    truth, pred, text = np.array(truth_rows), np.array(mask_rows), np.array(text_rows)
    print(f"Brixia comparison on {len(truth)} studies with notes and scores (senior reader > 0 = abnormal)")
    for j, (z, label) in enumerate(ZONES.items()):
        print(f"  {z} {label:<22} masks: {scores(truth[:, j], pred[:, j])}")
    print(f"  all zones, grounded masks:        {scores(truth.ravel(), pred.ravel())}")
    ci = "kappa 95 % CI (bootstrap of {} patients, {} resamples): [{:.2f}, {:.2f}]"
    print("    " + ci.format(len(set(patients)), BOOTSTRAP, *kappa_ci(truth, pred, patients)))
    print(f"  all zones, reported locations:    {scores(truth.ravel(), text.ravel())}")
    print("    " + ci.format(len(set(patients)), BOOTSTRAP, *kappa_ci(truth, text, patients)))
    print(f"  studies with any lung-lesion mask: {int(pred.any(axis=1).sum())} of {len(pred)}")
    share = 100 * neg_abnormal / neg_total if neg_total else float("nan")
    print(f"  lung-lesion negative pairs naming a senior-abnormal zone: {neg_abnormal} of {neg_total} ({share:.1f} %); "
          f"zone prevalence {100 * truth.mean():.1f} %")
    for group, (n, wrong) in sorted(neg_groups.items()):
        print(f"    {group:<45} {wrong:3d} of {n:3d} ({100 * wrong / n:5.1f} %)")
    share = 100 * junior_kept[1] / junior_kept[0] if junior_kept[0] else float("nan")
    print(f"    kept only where the junior reader scored every named zone 0 (an image check as good as a radiologist): "
          f"{junior_kept[1]} of {junior_kept[0]} ({share:.1f} %) in senior-abnormal zones")
    med = 100 * float(np.median(centre_shares)) if centre_shares else float("nan")
    print(f"  lung-lesion masks: {len(centre_shares)}, median share of pixels on heart or mediastinum {med:.1f} % "
          f"(share > 5 %: {sum(c > 0.05 for c in centre_shares)})")
    dropped: Counter[str] = Counter()
    for unit in (work / "dataset" / "units").glob("*.json"):
        dropped.update(json.loads(unit.read_text()).get("dropped_pairs", {}))
    print(f"  pairs left out by checks: {dict(sorted(dropped.items())) or 'none'}")
    placed: Counter[str] = Counter()
    for unit in (work / "dataset" / "units").glob("*.json"):
        placed.update(json.loads(unit.read_text()).get("placed_negatives", {}))
    print(f"  negatives placed away from flagged zones: {dict(sorted(placed.items())) or 'none'}")
    overlays = overlay_overlaps(work / "dataset", studies, anatomy, ids)
    marked = sum(r.ignore_mask_path is not None and sid in anatomy for sid, r in ids.items())
    print(f"  lung-lesion masks over burned-in annotations or devices (the annotators' ignore regions): "
          f"{len(overlays)} of {marked} noted films with such regions; over half of the region on "
          f"{sum(v > 0.5 for v in overlays.values())} "
          f"({', '.join(f'{k} {v:.2f}' for k, v in sorted(overlays.items()))})")


def overlay_overlaps(dataset: Path, studies: dict[str, Any], anatomy: dict[str, Any], ids: dict[str, Any]
                     ) -> dict[str, float]:
    """Study -> share of the annotators' ignore region (arrows, labels, devices) that the study's lung-lesion masks
    cover, for the studies whose masks touch it."""
    out: dict[str, float] = {}
    for sid, rec in ids.items():
        if rec.ignore_mask_path is None or sid not in anatomy:
            continue
        shape = (anatomy[sid]["height"], anatomy[sid]["width"])
        lesion = np.zeros(shape, bool)
        for p in studies.get(sid, {}).get("instruction_answer_pairs", {}).get("positive_pairs", []):
            if p["target"] in LUNG_LESIONS:
                lesion |= read_mask_png(dataset / "lesion_mask" / p["seg_mask_path"], shape)
        ignore = rec.ignore(shape)
        if (lesion & ignore).any():
            out[sid] = float((lesion & ignore).sum()) / float(ignore.sum())
    return out


def _gallery_panel(folder: Path, sid: str, rec: Any, image_path: Path, lesion: np.ndarray, centre: np.ndarray,
                   pairs: dict[str, Any], named: np.ndarray | None = None) -> None:
    """One PNG: the film with the study's lung-lesion masks (red), heart + mediastinum (yellow) and the zones its
    lung-lesion negatives name (green)."""
    from cxrground.io.image import read_image, write_image
    from cxrground.io.overlay import label_panel, overlay_masks

    im = read_image(image_path)
    rgb = overlay_masks(im.pixels, [centre], [(1.0, 0.85, 0.1)], alpha=0.15)
    if named is not None and named.any():
        rgb = overlay_masks(rgb, [named], [(0.1, 0.9, 0.2)], alpha=0.25)
    if lesion.any():
        rgb = overlay_masks(rgb, [lesion], [(1.0, 0.1, 0.1)], alpha=0.4)
    senior = "".join(f"{z}{rec.brixia.senior[z]}" for z in ZONES)
    lines = [f"Brixia senior {senior}"]
    lines += [f"+ {p['instruction'][:70]}" for p in pairs.get("positive_pairs", []) if p["type"] == "basic"][:3]
    lines += [f"- {n['instruction'][:70]}" for n in pairs.get("negative_pairs", [])][:6]
    folder.mkdir(parents=True, exist_ok=True)
    write_image(folder / f"{rec.image_path.stem}_{sid}.png", label_panel(rgb, rec.image_path.stem, lines, 420))


if __name__ == "__main__":
    main()
