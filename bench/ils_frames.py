"""Mask frames: what a perfect prediction scores in the reference (ROSALIA/LISA) evaluation and in ours.

Run: ``.venv/bin/python bench/ils_frames.py [--ils demo_out/ils] [--studies 16]``. Without ``--ils`` a synthetic
cohort of ``--studies`` studies is generated and built into an ILS dataset in a temporary folder.

For every positive mask of the dataset, the prediction is the mask itself (a perfect model):

1. the reference protocol (:func:`cxrground.ils.frames.reference_protocol_iou`: GT file resized longest side to
   1024 and padded, prediction cropped to the image's region and stretched to that grid) with the GT file in our
   **native** frame and in the **released** frame (512² stretched, ``ils export --frame released``);
2. the same at MIMIC-CXR's usual 3056×2544 (H×W): every mask stretched to that size first;
3. our metric (``ils evaluate``, native resolution) on the native dataset and on its released export (GT read
   back to native with the recorded transform; the loss is the 512² quantisation).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

MIMIC_HW = (3056, 2544)


def _build(root: Path, studies: int) -> Path:
    from cxrground.datasets.synthetic import write_cohort
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks

    write_cohort(root / "cohort", studies, seed=0, progress=False)
    tasks, failures = build_tasks(root / "cohort" / "files")
    build_dataset(tasks, root / "ils", IlsConfig(seed=0), BackendSpec(), scan_failures=failures, progress=False)
    return root / "ils"


def _positives(ils: Path) -> list[tuple[str, str]]:
    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    out = {}
    for split, studies in data.items():
        for study in studies.values():
            for p in study["instruction_answer_pairs"]["positive_pairs"]:
                out.setdefault(p["seg_mask_path"], split)
    return sorted(out.items())


def _perfect(ils: Path, out: Path, sizes: dict[str, tuple[int, int]]) -> Path:
    """Perfect predictions (``sizes``: native size per image, for studies without a positive mask)."""
    from cxrground.ils.predictions import prediction_line
    from cxrground.io.masks import read_mask_png

    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    lines = []
    for studies in data.values():
        for study in studies.values():
            pairs = study["instruction_answer_pairs"]
            shape = sizes.get(study["image_path"], (8, 8))
            for p in pairs["positive_pairs"]:
                mask = read_mask_png(ils / "lesion_mask" / p["seg_mask_path"])
                shape = mask.shape
                lines.append(prediction_line(p["pair_id"], p["answer"], mask, "free"))
            for p in pairs["negative_pairs"]:
                lines.append(prediction_line(p["pair_id"], p["answer"], np.zeros(shape, bool), "free"))
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def main() -> None:
    from cxrground.evaluation.ils import evaluate_dataset
    from cxrground.ils.frames import RELEASED_SIZE, export_dataset, read_frame, reference_protocol_iou, stretch
    from cxrground.io.masks import read_mask_png

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ils", type=Path, default=None)
    ap.add_argument("--studies", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ils = args.ils or _build(root, args.studies)
        released = root / "released"
        export_dataset(ils, released)
        masks = _positives(ils)
        scores: dict[str, list[float]] = {k: [] for k in ("native", "released", "native@mimic", "released@mimic")}
        sizes = set()
        for rel, _split in masks:
            native = read_mask_png(ils / "lesion_mask" / rel)
            sizes.add(native.shape)
            rel_mask = read_mask_png(released / "lesion_mask" / rel)
            scores["native"].append(reference_protocol_iou(native, native))
            scores["released"].append(reference_protocol_iou(rel_mask, native))
            big = stretch(native, MIMIC_HW)
            scores["native@mimic"].append(reference_protocol_iou(big, big))
            scores["released@mimic"].append(reference_protocol_iou(stretch(big, (RELEASED_SIZE,) * 2), big))
        hs, ws = sorted(h for h, _ in sizes), sorted(w for _, w in sizes)
        print(f"dataset: {ils} ({len(masks)} positive masks; image H {hs[0]}-{hs[-1]}, W {ws[0]}-{ws[-1]})")
        print("reference protocol, perfect prediction, gIoU over masks (%):")
        for k, v in scores.items():
            print(f"  GT file in the {k.split('@')[0]:8s} frame{' at 3056x2544' if '@' in k else '':14s}: "
                  f"{100 * float(np.mean(v)):.1f}")
        preds = _perfect(ils, root / "perfect.jsonl", read_frame(released).native_hw)
        for name, folder in (("native", ils), ("released export", released)):
            per_split = []
            for split in ("train", "val", "test"):
                res = evaluate_dataset(folder, preds, split=split, n_boot=0)
                if res["segmentation"]["n_positive"]:
                    per_split.append((split, res["segmentation"]["gIoU"], res["segmentation"]["n_positive"]))
            text = ", ".join(f"{s} {100 * g:.1f} (n={n})" for s, g, n in per_split)
            print(f"ils evaluate (native resolution), perfect prediction, {name}: gIoU {text}")
            if per_split and name != "native":
                print("  (GT read back to native with the recorded transform; the loss is the 512² quantisation)")


if __name__ == "__main__":
    main()
