"""ILS build on the synthetic cohort: throughput per core and quality against the exact truth.

Run: ``.venv/bin/python bench/ils_build.py [--studies 40]``. Builds the same cohort four ways
(lung U-Net vs the cohort's exact anatomy masks; Table 7 τ vs half τ), one worker each, and prints
studies/s/core with the backends named, then gIoU / cIoU of the generated masks, recall of reported
findings and the share of negatives that are truly lesion-free (``cxrground.ils.quality``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cxrground.datasets.synthetic import write_cohort
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.quality import format_quality, score_against_truth
from cxrground.ils.tasks import build_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--studies", type=int, default=40)
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cxrground-ils-bench-"))
    cohort = work / "cohort"
    write_cohort(cohort, args.studies, seed=args.seed, progress=False)
    tasks, failures = build_tasks(cohort / "files")
    runs = [
        ("unet", 1.0, BackendSpec()),
        ("truth anatomy", 1.0, BackendSpec(segmenter="masks", segmenter_kwargs={"root": str(cohort / "masks")})),
        ("unet, half τ", 0.5, BackendSpec()),
        ("truth anatomy, half τ", 0.5, BackendSpec(segmenter="masks",
                                                   segmenter_kwargs={"root": str(cohort / "masks")})),
    ]
    for i, (name, scale, spec) in enumerate(runs):
        out = work / f"run{i}"
        start = time.perf_counter()
        summary = build_dataset(tasks, out, IlsConfig(seed=0).with_threshold_scale(scale), spec,
                                scan_failures=failures, progress=False)
        seconds = time.perf_counter() - start
        print(f"\n## {name}: {summary.studies_in_dataset} studies, {summary.pairs} pairs, "
              f"{summary.failures} failures; {len(tasks) / seconds:.2f} studies/s on 1 worker "
              f"({1000 * seconds / len(tasks):.0f} ms/study; backends: rules structurer, {spec.segmenter} "
              f"segmenter, pseudo-normal synthesizer, anomaly boxes; working size 512)")
        print(format_quality(score_against_truth(out, cohort)))


if __name__ == "__main__":
    main()
