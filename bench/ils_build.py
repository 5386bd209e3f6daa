"""ILS build on the synthetic cohort: throughput per core and quality against the exact truth.

Run: ``.venv/bin/python bench/ils_build.py [--studies 40] [--speed-studies 8] [--skip-quality] [--skip-speed]
[--only TEXT]``.

1. **Speed at real size**: the same cohort generated 512 px wide and 2800 px wide (MIMIC size), built with
   the default built-in backends (U-Net lungs + seen heart, normative normal image, anomaly boxes), one
   worker, one thread; prints studies/s/core at each size and the 2800/512 time ratio (targets: ≥ 1.5
   studies/s/core at 2800 px, ratio ≤ 2).
2. **Quality**: builds the 512-px cohort with the default (the normative model fitted on the build's own
   report-normal studies, trimmed, band 0, detector strength 0.14), the default before issue 14's real-film
   changes, the pseudo-normal image, the shipped ``normative_v1``, an unshrunk fit and the ``trim=prior`` fit,
   with the U-Net and with the cohort's exact anatomy masks, and the learned lesion segmenter (``lesion-unet``,
   pairs checked against the image), and prints
   studies/s/core, gIoU / cIoU of the generated masks, recall of reported findings and the share of
   negatives that are truly lesion-free (``cxrground.ils.quality``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from cxrground.datasets.synthetic import write_cohort
from cxrground.datasets.synthetic.config import SynthConfig
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.quality import format_quality, score_against_truth
from cxrground.ils.tasks import build_tasks


def speed(work: Path, studies: int, seed: int) -> None:
    """Studies/s/core of the default build at 512 and 2800 px wide (backends loaded before timing)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from cxrground.ils.pipeline import get_backends

    spec = BackendSpec(segmenter_kwargs={"threads": 1})
    get_backends(spec).segmenter.segment  # noqa: B018 - the backends are built once per process
    seconds = {}
    for width in (512, 2800):
        cohort = work / f"cohort{width}"
        write_cohort(cohort, studies, seed=seed, config=SynthConfig(width=width), progress=False)
        tasks, failures = build_tasks(cohort / "files")
        warm = work / f"warm{width}"
        build_dataset(tasks[:1], warm, IlsConfig(seed=0), spec, scan_failures=failures, progress=False)
        start = time.perf_counter()
        summary = build_dataset(tasks, work / f"speed{width}", IlsConfig(seed=0), spec, scan_failures=failures,
                                progress=False)
        seconds[width] = (time.perf_counter() - start) / len(tasks)
        print(f"{width} px wide: {1 / seconds[width]:.2f} studies/s/core ({1000 * seconds[width]:.0f} ms/study, "
              f"{summary.studies_in_dataset} studies, {summary.pairs} pairs; default backends, 1 worker, 1 thread)")
    print(f"2800 px / 512 px time per study: {seconds[2800] / seconds[512]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--studies", type=int, default=40)
    parser.add_argument("--speed-studies", type=int, default=8)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="quality: only the runs whose name contains TEXT (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cxrground-ils-bench-"))
    if not args.skip_speed:
        speed(work, args.speed_studies, args.seed)
    if args.skip_quality:
        return
    cohort = work / "cohort"
    write_cohort(cohort, args.studies, seed=args.seed, progress=False)
    tasks, failures = build_tasks(cohort / "files")
    truth = {"root": str(cohort / "masks")}
    shipped, cohort_fit = {"model": "shipped"}, {"model": "cohort"}
    before = {"synthesizer_kwargs": {"band": "2", "trim": "off"}, "detector_kwargs": {"strength_mid": "0.26"}}
    runs = [
        ("unet, normative fitted, trim=cohort, band 0, detector strength 0.14 (default)", 1.0, BackendSpec()),
        ("unet, normative fitted, trim=off, band 2, detector strength 0.26 (default before issue 14's real-film "
         "changes)", 1.0, BackendSpec(synthesizer="normative", **before)),
        ("unet, pseudo-normal", 1.0, BackendSpec(synthesizer="pseudo-normal")),
        ("unet, normative shipped normative_v1", 1.0, BackendSpec(synthesizer="normative", synthesizer_kwargs=shipped)),
        ("unet, normative fitted, not shrunk", 1.0,
         BackendSpec(synthesizer="normative", synthesizer_kwargs={**cohort_fit, "shrink": "false"})),
        ("unet, normative fitted, trim=prior", 1.0,
         BackendSpec(synthesizer="normative", synthesizer_kwargs={**cohort_fit, "trim": "prior"})),
        ("truth anatomy, pseudo-normal", 1.0, BackendSpec(segmenter="masks", segmenter_kwargs=truth,
                                                          synthesizer="pseudo-normal")),
        ("truth anatomy, normative default", 1.0, BackendSpec(segmenter="masks", segmenter_kwargs=truth)),
        ("unet, normative default, half τ", 0.5, BackendSpec()),
        ("unet, lesion-unet (lesion segmenter; pairs checked against the image)", 1.0,
         BackendSpec(synthesizer="lesion-unet")),
        ("unet, lesion-unet + zone_sim_v1 check of negatives (exploratory)", 1.0,
         BackendSpec(synthesizer="lesion-unet", synthesizer_kwargs={"zone_reader": "zone_sim_v1"})),
    ]
    for i, (name, scale, spec) in enumerate(runs):
        if args.only and not any(text in name for text in args.only):
            continue
        out = work / f"run{i}"
        start = time.perf_counter()
        summary = build_dataset(tasks, out, IlsConfig(seed=0).with_threshold_scale(scale), spec,
                                scan_failures=failures, progress=False)
        seconds = time.perf_counter() - start
        print(f"\n## {name}: {summary.studies_in_dataset} studies, {summary.pairs} pairs, "
              f"{summary.failures} failures; {len(tasks) / seconds:.2f} studies/s on 1 worker "
              f"({1000 * seconds / len(tasks):.0f} ms/study; backends: rules structurer, {spec.segmenter} "
              f"segmenter, {spec.synthesizer} synthesizer {spec.synthesizer_kwargs or ''}, anomaly boxes "
              f"{spec.detector_kwargs or ''}; working size 512)")
        fitted = out / "normative_fitted.json"
        if fitted.is_file():
            meta = json.loads(fitted.read_text())
            print(f"normative model: {meta['source']}, {meta['films']} films ({meta['report_normal']} report-normal "
                  f"of {meta['visited']} visited, {meta.get('trimmed', {}).get('films', 0)} trimmed); prior weight "
                  f"{meta.get('shrinkage', {}).get('mean_prior_weight')}")
        print(format_quality(score_against_truth(out, cohort)))


if __name__ == "__main__":
    main()
