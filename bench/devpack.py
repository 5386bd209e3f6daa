"""Copy the pack's shippable-licence COVID-19 collection rows into a small pack of their own.

Used to carry the training data of a shipped model to a machine that has no copy of the pack (a lent GPU):
the README, the three CSV files cut to the shippable rows, their images and their masks, and empty NIH
files, so :class:`cxrground.datasets.pack.Pack` opens it as a pack. No CC BY-NC-SA row is copied, so a
model trained on the copy cannot have seen one::

    python bench/devpack.py --out .devpack/cxr-pack-v1      # 97 rows, about 14 MB
"""

from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

from cxrground.datasets.pack import Pack


def copy_shippable(pack: Pack, out: Path) -> int:
    """Write the pack's shippable COVID-19 rows under ``out``; returns how many rows were copied."""
    rows = pack.cohen(shippable_only=True)
    keep = {r.image_path.name for r in rows}
    src = pack.root / "cohen"
    (out / "cohen" / "images").mkdir(parents=True, exist_ok=True)
    (out / "cohen" / "masks").mkdir(parents=True, exist_ok=True)
    (out / "nih").mkdir(parents=True, exist_ok=True)
    shutil.copy2(pack.root / "README.md", out / "README.md")
    with (src / "metadata.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        kept = [row for row in reader if row["image"] in keep]
        fields = reader.fieldnames or []
    with (out / "cohen" / "metadata.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)
    for name in ("brixia_scores.csv", "severity_scores.csv"):
        shutil.copy2(src / name, out / "cohen" / name)
    for rec in rows:
        for path in (rec.image_path, rec.right_mask_path, rec.left_mask_path, rec.ignore_mask_path):
            if path is not None:
                shutil.copy2(path, out / "cohen" / path.parent.name / path.name)
    nih_headers = {"labels.csv": "image,labels,view,age,sex,orig_size", "boxes_512.csv": "image,label,x,y,w,h"}
    for name, header in nih_headers.items():
        (out / "nih" / name).write_text(header + "\n")
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=Path, default=None, help="The full pack (default: CXRGROUND_PACK or ../shared).")
    ap.add_argument("--out", type=Path, required=True, help="Folder of the copy (a cxr-pack-v1 folder).")
    args = ap.parse_args()
    n = copy_shippable(Pack(args.pack), args.out)
    print(f"{n} shippable rows copied to {args.out}")


if __name__ == "__main__":
    main()
