"""ILS steps 2-4 on synthetic phantoms: pseudo-normal → anomaly → boxes → Algorithm 1 (+ refinement) → GL.

Run: ``.venv/bin/python bench/grounding.py [--studies 40] [--seed 7] [--size 512]``. Prints numbers only.

For every present lesion of every phantom, a finding is built with the TRUE reported location of the
truth record and grounded exactly as the pipeline does (letterbox to the working canvas, ``lungs ∪ heart``
edit mask, Table 7 thresholds of ``IlsConfig``, which are never changed here). Reported per lesion:

- recall: share of findings that received a non-empty mask (paper Table 8, default τ: 13-58 %);
- gIoU / cIoU of the produced masks against the exact truth masks — the union of the truth masks of the
  same lesion that overlap the finding's reported-location anatomy — on the found findings, and with
  misses counted as IoU 0 (cIoU: the miss adds its truth area to the union);
- GL precision: share of grounded-location labels that the truth lesion really overlaps;
- false-positive rate: queries for a lung lesion at a location label where the truth has no lesion of any
  type (two per study, drawn with a seeded RNG, alternating general- and edema-threshold lesions), counted
  when a mask is produced;
- time per study (ms) of the whole chain at the working size.

These are measurements on procedural phantoms, not claims about real radiographs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

from cxrground.anatomy import ils_location_masks
from cxrground.datasets.synthetic import generate_study
from cxrground.ils.config import IlsConfig
from cxrground.ils.grounding import ground_finding
from cxrground.ils.spatial import AnomalyBoxDetector, PseudoNormalSynthesizer, anomaly_map
from cxrground.ils.verify import empty_locations, verify_location
from cxrground.io.transform import Letterbox
from cxrground.reports.findings import Finding
from cxrground.vocab import ILS_LOCATION_LABELS
from cxrground.vocab.lesions import LESIONS

TABLE8_DEFAULT = {"atelectasis": 13.4, "pneumonia": 28.5, "effusion": 16.0, "opacity": 21.6, "edema": 58.0,
                  "consolidation": 31.9}
TABLE8_HALF = {"atelectasis": 28.7, "pneumonia": 49.8, "effusion": 32.6, "opacity": 40.3, "edema": 82.1,
               "consolidation": 50.6}
FP_LESIONS = ("pneumonia", "edema", "opacity", "edema", "atelectasis", "edema", "consolidation", "effusion")


def _iou(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    return int((a & b).sum()), int((a | b).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--size", type=int, default=512, help="working canvas side (letterbox)")
    parser.add_argument("--no-regions", action="store_true",
                        help="give the synthesizer only the edit mask (no lung/heart regions)")
    parser.add_argument("--synth", default="{}", help="JSON kwargs of PseudoNormalSynthesizer")
    parser.add_argument("--detector", default="{}", help="JSON kwargs of AnomalyBoxDetector")
    args = parser.parse_args()

    synth = PseudoNormalSynthesizer(**json.loads(args.synth))
    detector = AnomalyBoxDetector(**json.loads(args.detector))
    configs = {"default": replace(IlsConfig(), working_size=args.size)}
    configs["half"] = configs["default"].with_threshold_scale(0.5)
    rng = np.random.default_rng(args.seed)

    stats = {k: defaultdict(lambda: {"n": 0, "found": 0, "iou": [], "i": 0, "u": 0, "u_all": 0, "gl": [0, 0]})
             for k in configs}
    fp = {k: defaultdict(lambda: [0, 0]) for k in configs}
    times: list[float] = []
    n_boxes: list[int] = []
    el_sizes: list[int] = []
    for index in range(args.studies):
        study = generate_study(args.seed, index)
        truth = study.truth
        am = study.anatomy_masks
        start = time.perf_counter()
        box = Letterbox.fit(study.image.shape, args.size)
        canvas = box.image_to_canvas(study.image)
        right, left, heart = (box.mask_to_canvas(am[k]) for k in ("right_lung", "left_lung", "heart"))
        locations = ils_location_masks(right, left)
        edit = right | left | heart
        regions = None if args.no_regions else (right, left, heart)
        x_hat = synth.synthesize(canvas, edit, regions=regions)
        anomaly = anomaly_map(canvas, x_hat)
        boxes = detector.detect(canvas, anomaly)
        findings = []
        for f in truth.present_findings:
            assertion = "uncertain" if f.certainty == "tentative" else "present"
            findings.append(Finding(entity=f.lesion, sent_idx=1, assertion=assertion, lesion=f.lesion,
                                    reported_location=tuple(f.reported_location), source="truth"))
        results = {k: [ground_finding(f, canvas, anomaly, locations, right, left, heart, boxes, cfg)
                       for f in findings] for k, cfg in configs.items()}
        for r in results["default"]:
            if r.grounded and r.lesion != "cardiomegaly":
                verify_location(r.reported_location, locations, r.selected, configs["default"])
        el = empty_locations(findings, locations)
        times.append(time.perf_counter() - start)
        n_boxes.append(len(boxes))
        el_sizes.append(len(el))

        lesion_canvas = [box.mask_to_canvas(m) for m in study.lesion_masks]
        any_lesion = np.zeros_like(right)
        for f, m in zip(truth.present_findings, lesion_canvas, strict=True):
            if f.lesion != "cardiomegaly":
                any_lesion |= m
        for key, res in results.items():
            for f, r in zip(findings, res, strict=True):
                s = stats[key][f.lesion]
                if f.lesion == "cardiomegaly":
                    target = heart
                else:
                    union = np.zeros_like(right)
                    for lab in f.reported_location:
                        union |= locations.get(lab, np.zeros_like(right))
                    target = np.zeros_like(right)
                    for g, m in zip(truth.present_findings, lesion_canvas, strict=True):
                        if g.lesion == f.lesion and (m & union).any():
                            target |= m
                s["n"] += 1
                gt_area = int(target.sum())
                if r.grounded:
                    i, u = _iou(r.mask, target)
                    s["found"] += 1
                    s["iou"].append(i / u if u else 0.0)
                    s["i"] += i
                    s["u"] += u
                    s["u_all"] += u
                    if f.lesion != "cardiomegaly":
                        check = verify_location(f.reported_location, locations, r.selected, configs[key])
                        for lab in check.grounded:
                            s["gl"][0] += int((locations[lab] & target).any())
                            s["gl"][1] += 1
                else:
                    s["iou"].append(None)
                    s["u_all"] += gt_area
        # false-positive queries: labels with no truth lesion of any type
        free = [lab for lab in ILS_LOCATION_LABELS if locations[lab].any() and not (locations[lab] & any_lesion).any()]
        if free:
            picks = rng.choice(len(free), size=min(2, len(free)), replace=False)
            for j, p in enumerate(picks):
                lesion = FP_LESIONS[(2 * index + j) % len(FP_LESIONS)]
                q = Finding(entity=lesion, sent_idx=1, assertion="present", lesion=lesion,
                            reported_location=(free[int(p)],), source="bench")
                for key, cfg in configs.items():
                    r = ground_finding(q, canvas, anomaly, locations, right, left, heart, boxes, cfg)
                    tag = "edema τ" if lesion == "edema" else "general τ"
                    fp[key][tag][0] += int(r.grounded)
                    fp[key][tag][1] += 1

    regions_used = "no" if args.no_regions else "yes"
    print(f"studies {args.studies} (seed {args.seed}), canvas {args.size}, regions {regions_used}")
    print(f"synthesizer {json.dumps(synth.provenance()['settings'])}")
    print(f"detector {json.dumps(detector.provenance()['settings'])}")
    print(f"boxes per study: mean {np.mean(n_boxes):.1f}, max {max(n_boxes)}; EL labels per study: "
          f"mean {np.mean(el_sizes):.1f}")
    print(f"time per study (letterbox + x̂ + anomaly + boxes + grounding of all findings + GL/EL): "
          f"mean {1000 * np.mean(times):.0f} ms, median {1000 * np.median(times):.0f} ms, "
          f"max {1000 * max(times):.0f} ms")
    for key in configs:
        ref = TABLE8_DEFAULT if key == "default" else TABLE8_HALF
        print(f"\n== {key} τ ==")
        print(f"{'lesion':<14}{'n':>4}{'recall%':>9}{'paper%':>8}{'gIoU|f':>8}{'cIoU|f':>8}{'gIoU':>7}{'cIoU':>7}"
              f"{'GLprec':>8}")
        tot = {"n": 0, "found": 0}
        for lesion in LESIONS:
            s = stats[key].get(lesion)
            if not s or not s["n"]:
                continue
            found = [v for v in s["iou"] if v is not None]
            g_f = 100 * np.mean(found) if found else float("nan")
            g_all = 100 * np.mean([v or 0.0 for v in s["iou"]])
            c_f = 100 * s["i"] / s["u"] if s["u"] else float("nan")
            c_all = 100 * s["i"] / s["u_all"] if s["u_all"] else float("nan")
            glp = 100 * s["gl"][0] / s["gl"][1] if s["gl"][1] else float("nan")
            paper = f"{ref[lesion]:.1f}" if lesion in ref else "-"
            print(f"{lesion:<14}{s['n']:>4}{100 * s['found'] / s['n']:>9.1f}{paper:>8}{g_f:>8.1f}{c_f:>8.1f}"
                  f"{g_all:>7.1f}{c_all:>7.1f}{glp:>8.1f}")
            if lesion != "cardiomegaly":
                tot["n"] += s["n"]
                tot["found"] += s["found"]
        print(f"{'lung+pleural':<14}{tot['n']:>4}{100 * tot['found'] / max(tot['n'], 1):>9.1f}")
        for tag, (hit, n) in sorted(fp[key].items()):
            print(f"false-positive queries ({tag}): {hit}/{n} = {100 * hit / max(n, 1):.1f} %")


if __name__ == "__main__":
    main()
