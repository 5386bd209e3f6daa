"""CheXpercept build time per case with the builtin deformer on a synthetic-cohort ILS dataset.

Run: ``.venv/bin/python bench/percept_build.py [--studies 24] [--width 512] [--workers 1]``. Makes a cohort and
its ILS dataset in a temporary folder (not timed), then times ``build_benchmark`` (per-lesion 100,100,100, i.e.
everything the data allows) and prints cases/s, the planning time per positive candidate, the rendering time
per case split by path (from a second, render-only pass timed per case) and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from cxrground.percept.build import BuildOptions, build_benchmark
from cxrground.percept.case_files import CaseTask, render_case
from cxrground.percept.cases import Candidate
from cxrground.percept.layout import case_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--studies", type=int, default=24)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cxrground-percept-bench-"))
    cli = [sys.executable, "-m", "cxrground"]
    subprocess.run([*cli, "synth", "--out", str(root / "cohort"), "--studies", str(args.studies), "--seed",
                    str(args.seed), "--width", str(args.width), "--quiet"], check=True, capture_output=True)
    subprocess.run([*cli, "ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                    "--seed", str(args.seed), "--workers", "2"], check=True, capture_output=True)
    opts = BuildOptions(ils=str(root / "ils"), images=str(root / "cohort" / "files"), splits=("train", "val", "test"),
                        seed=args.seed)
    start = time.perf_counter()
    s = build_benchmark(opts, root / "bench", workers=args.workers, progress=False, keep_work=True)
    wall = time.perf_counter() - start
    print(f"build: {s.cases} cases ({s.items} items) from {s.planned} planned positive candidates, "
          f"{s.failures} dropped, {wall:.1f} s wall, workers={args.workers}, image width {args.width}")
    print(f"  {s.cases / wall:.2f} cases/s; {wall / max(1, s.planned):.2f} s per planned positive (plan + render)")
    bench = json.loads((root / "bench" / "chexpercept.json").read_text())
    data = json.loads((root / "ils" / "mimic_ils_instruction_answer.json").read_text())
    paths = {k: v for split in data.values() for k, v in split.items()}
    per_path: dict[str, list[float]] = defaultdict(list)
    for key, case in sorted(bench.items()):
        study = paths[case["pair_id"].split("_")[0]]
        cand = Candidate(key, case["lesion"], case["pair_id"], case["pair_id"].split("_")[0], "", case["dicom_id"],
                         study["image_path"], case["qa_path"] != "lesion_free", "")
        task = CaseTask(cand, case_folder(args.seed, key), case["qa_path"],
                        str(root / "cohort" / "files" / study["image_path"]))
        t0 = time.perf_counter()
        render_case(task, str(root / "bench"))
        per_path[case["qa_path"]].append(time.perf_counter() - t0)
    for path, times in sorted(per_path.items()):
        print(f"  render {path:<18} {len(times):3d} cases  {sum(times) / len(times) * 1000:7.1f} ms/case")
    plan_s = wall - sum(sum(t) for t in per_path.values())
    print(f"  planning (refine + deform + distractors + attributes) ≈ {plan_s / max(1, s.planned):.2f} s "
          "per positive candidate")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (this process)")


if __name__ == "__main__":
    main()
