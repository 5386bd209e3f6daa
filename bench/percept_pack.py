"""A CheXpercept benchmark from real radiographs: the pack's COVID-19 collection rows with notes and lung masks.

Run: ``.venv/bin/python bench/percept_pack.py [--rows 40] [--per-lesion 2,2,2] [--segmenter unet|masks] [--out
DIR]``. Steps: an ILS dataset from the first ``--rows`` noted rows (notes as reports; lungs from the shipped U-Net
with the seen-border heart outline, the defaults of ``ils build``, or with ``--segmenter masks`` the pack's
annotated lungs; see ``bench/ils_pack.py``), then ``percept build`` over all its splits with the builtin
deformer, ``percept validate`` and the gallery. Prints the build time, the cases per lesion and path, the drop
reasons, the validation result and where the gallery is, so that a person can look at real rendered items.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from ils_pack import cohen_ils_dataset

from cxrground.datasets.pack import Pack
from cxrground.percept.build import BuildOptions, build_benchmark
from cxrground.percept.gallery import render_gallery
from cxrground.percept.validate import validate_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40, help="Noted COVID-19 collection rows to use.")
    parser.add_argument("--per-lesion", default="2,2,2", help="LF,RF,RR cases per lesion.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--segmenter", default="unet", choices=["unet", "masks"],
                        help="lungs and heart: the ils build default (unet) or the pack's lung masks (masks)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="cxrground-percept-pack-"))
    cohen_ils_dataset(Pack(), work, args.segmenter, limit=args.rows)
    lf, rf, rr = (int(x) for x in args.per_lesion.split(","))
    opts = BuildOptions(ils=str(work / "dataset"), images=str(Pack().root / "cohen" / "images"),
                        per_lesion=(lf, rf, rr), splits=("train", "val", "test"), seed=args.seed)
    start = time.perf_counter()
    summary = build_benchmark(opts, work / "bench", workers=1, progress=False, overwrite=True)
    print(f"percept build: {summary.cases} cases, {summary.items} items from {summary.planned} planned positives "
          f"({summary.failures} dropped) in {time.perf_counter() - start:.1f} s")
    print("cases per lesion (LF / RF / RR): " + "; ".join(
        f"{lesion} {c['lesion_free']}/{c['revision_free']}/{c['revision_required']}"
        for lesion, c in summary.counts.items()))
    failures = work / "bench" / "failures.jsonl"
    reasons = Counter(json.loads(x)["reason"].split(":")[0] for x in failures.read_text().splitlines() if x.strip())
    print("dropped: " + (", ".join(f"{r} ({n})" for r, n in reasons.most_common()) or "none"))
    problems = validate_benchmark(work / "bench")
    print("validate: " + ("valid" if not problems else f"{len(problems)} problems: {problems[:5]}"))
    n = render_gallery(work / "bench", work / "gallery.html")
    print(f"gallery: {work / 'gallery.html'} ({n} cases)")


if __name__ == "__main__":
    main()
