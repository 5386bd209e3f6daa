"""ILS build on the synthetic cohort: throughput per core and quality against the exact truth.

Run: ``.venv/bin/python bench/ils_build.py [--studies 40] [--speed-studies 8] [--real-films 20] [--skip-quality]
[--skip-speed] [--only TEXT]``.

1. **Speed at real size**: the same cohort generated 512 px wide and 2800 px wide (MIMIC size), built with
   the default built-in backends (U-Net lungs + seen heart, normative normal image, anomaly boxes), one
   worker, one thread; prints studies/s/core at each size and the 2800/512 time ratio (targets: ≥ 1.5
   studies/s/core at 2800 px, ratio ≤ 2). **On real films** (``--real-films N``, needs the pack): the first N
   COVID-19 collection rows with notes (the notes are the reports), each film resized to 512 px and to 2800 px
   wide (bicubic; an upsampled pack film stands in for a MIMIC-size film) and written as 8-bit JPEG (quality 95,
   as MIMIC-CXR-JPG), built the same way; prints the same numbers and where the 2800-px time goes
   (``cProfile``, top functions by own time).
2. **Quality**: builds the 512-px cohort with the default (the normative model fitted on the build's own
   report-normal studies, trimmed, band 0, detector strength 0.14, lung-lesion masks guided by ``zone_prior_v2``),
   the default without the zone guide (Algorithm 1 alone) and with ``zone_prior_v1`` guiding, the former default
   of the normative model, the pseudo-normal image, the shipped ``normative_v1``, an unshrunk fit and the
   ``trim=prior`` fit, with the U-Net and with the cohort's exact anatomy masks, and the learned lesion segmenter
   (``lesion-unet``, pairs checked against the image), the default with the ``zone_prior_v1`` check of negatives
   (``--negative-check zone_prior_v1``, ``zone_prior_v2``), and prints
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
from cxrground.ils.config import NEGATIVE_CHECKS, ZONE_GUIDES, IlsConfig
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


def real_speed(work: Path, films: int, profile: bool = True) -> None:
    """The speed rows on real films: pack films resized to 512 and 2800 px wide, default backends, 1 thread."""
    import cProfile
    import io
    import os
    import pstats

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from PIL import Image

    from cxrground.datasets.pack import Pack, PackMissingError
    from cxrground.ils.pipeline import get_backends

    try:
        rows = [r for r in Pack().cohen() if r.notes][:films]
    except PackMissingError as exc:
        print(f"real-film speed skipped: {exc}")
        return
    spec = BackendSpec(segmenter_kwargs={"threads": 1})
    get_backends(spec).segmenter.segment  # noqa: B018 - the backends are built once per process
    seconds = {}
    for width in (512, 2800):
        folder = work / f"real{width}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, r in enumerate(rows):
            im = Image.open(r.image_path).convert("L")
            im = im.resize((width, round(im.height * width / im.width)), Image.Resampling.BICUBIC)
            name = f"film{i:03d}.jpg"
            im.save(folder / name, quality=95)
            lines.append(json.dumps({"image": name, "study_id": f"s{900000 + i}", "subject_id": r.patient_id,
                                     "report": r.notes}) + "\n")
        (folder / "index.jsonl").write_text("".join(lines))
        tasks, failures = build_tasks(folder, index=folder / "index.jsonl")
        build_dataset(tasks[:1], work / f"realwarm{width}", IlsConfig(seed=0), spec, scan_failures=failures,
                      progress=False)
        start, cpu = time.perf_counter(), time.process_time()
        summary = build_dataset(tasks, work / f"realspeed{width}", IlsConfig(seed=0), spec, scan_failures=failures,
                                progress=False)
        wall = (time.perf_counter() - start) / len(tasks)
        seconds[width] = (time.process_time() - cpu) / len(tasks)
        print(f"real films {width} px wide: {1 / seconds[width]:.2f} studies/s/core ({1000 * seconds[width]:.0f} "
              f"ms CPU/study, {1000 * wall:.0f} ms wall; {len(tasks)} films, {summary.studies_in_dataset} studies, "
              f"{summary.pairs} pairs; default backends, 1 worker, 1 thread)")
        prof = cProfile.Profile() if profile and width == 2800 else None
        if prof is not None:  # a second build, profiled (the timed one is not slowed by the profiler)
            prof.enable()
            build_dataset(tasks, work / "realprofile", IlsConfig(seed=0), spec, scan_failures=failures,
                          progress=False)
            prof.disable()
        if prof is not None:
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf).sort_stats("tottime")
            stats.print_stats(12)
            print("  2800-px build, top functions by own time (cProfile, adds overhead):")
            print("\n".join("    " + ln for ln in buf.getvalue().splitlines() if ln.strip()[:1].isdigit()))
    print(f"real films 2800 px / 512 px CPU time per study: {seconds[2800] / seconds[512]:.2f} (target <= 2; CPU "
          f"time of this process, so other processes on a shared machine do not inflate it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--studies", type=int, default=40)
    parser.add_argument("--speed-studies", type=int, default=8)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--real-films", type=int, default=20, help="pack films for the real-film speed rows (0: none)")
    parser.add_argument("--no-profile", action="store_true", help="real-film rows without the cProfile table")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="quality: only the runs whose name contains TEXT (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cxrground-ils-bench-"))
    if not args.skip_speed:
        if args.speed_studies:
            speed(work, args.speed_studies, args.seed)
        if args.real_films:
            real_speed(work, args.real_films, not args.no_profile)
    if args.skip_quality:
        return
    cohort = work / "cohort"
    write_cohort(cohort, args.studies, seed=args.seed, progress=False)
    tasks, failures = build_tasks(cohort / "files")
    truth = {"root": str(cohort / "masks")}
    shipped, cohort_fit = {"model": "shipped"}, {"model": "cohort"}
    before = {"synthesizer_kwargs": {"band": "2", "trim": "off"}, "detector_kwargs": {"strength_mid": "0.26"}}
    runs = [
        ("unet, normative fitted, trim=cohort, band 0, detector strength 0.14, zone guide zone_prior_v2 (default)", 1.0,
         BackendSpec()),
        ("unet, normative fitted, trim=off, band 2, detector strength 0.26 (former normative default)", 1.0,
         BackendSpec(synthesizer="normative", **before)),
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
        ("unet, normative default + zone_prior_v1 check of negatives", 1.0, BackendSpec()),
        ("unet, normative default + zone_prior_v2 check of negatives", 1.0, BackendSpec()),
        ("unet, normative default + algorithm1 check of negatives", 1.0, BackendSpec()),
        ("unet, normative default, no zone guide (Algorithm 1 alone)", 1.0, BackendSpec()),
        ("unet, normative default, ILS.md's rules read literally (--paper-rules)", 1.0, BackendSpec()),
        ("unet, normative default, zone guide zone_prior_v1 instead of zone_prior_v2", 1.0, BackendSpec()),
        ("unet, normative default, negatives kept off lungs with a reported finding", 1.0, BackendSpec()),
        ("unet, normative default, global negatives need an empty location", 1.0, BackendSpec()),
        ("unet, normative default, masks not clipped off the heart and mediastinum", 1.0, BackendSpec()),
        ("truth anatomy, normative default, masks not clipped off the heart and mediastinum", 1.0,
         BackendSpec(segmenter="masks", segmenter_kwargs=truth)),
    ]
    for i, (name, scale, spec) in enumerate(runs):
        if args.only and not any(text in name for text in args.only):
            continue
        out = work / f"run{i}"
        start = time.perf_counter()
        check = next((r for r in NEGATIVE_CHECKS if f"{r} check" in name), "none")
        literal = "--paper-rules" in name
        guide = "none" if "no zone guide" in name or literal else \
            next((r for r in ZONE_GUIDES if f"zone guide {r}" in name), IlsConfig().zone_guide)
        config = IlsConfig(seed=0, negative_check=check, lung_lesions_off_centre="not clipped" not in name,
                           negative_exclusion="lung" if "negatives kept off lungs" in name else "location",
                           zone_guide=guide,
                           global_negative_needs_region="global negatives need an empty location" in name,
                           silent_report_negatives=literal, grounded_location="boxes" if literal else "mask",
                           prominent_heart_negative=literal)
        summary = build_dataset(tasks, out, config.with_threshold_scale(scale), spec,
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
