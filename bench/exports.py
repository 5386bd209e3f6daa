"""ILS exports on real films: hf, coco and dicom-seg of an ILS dataset built from the pack's COVID-19 collection.

Run: ``.venv/bin/python bench/exports.py [--limit 40] [--out DIR]``. Builds the dataset as ``bench/ils_pack.py``
does (the noted rows, the pack's lung masks as segmenter), writes every study image again as a DICOM file
(``write_dicom``, same pixels) for the dicom-seg export, then for each format prints the time, the size on disk
(and, for hf, the size relative to the dataset's images + masks: pair rows repeat the study image on each pair
row, study rows hold it once)
and whether everything reads back identical: every pair and mask through ``datasets``, every mask through
pycocotools' ``annToMask``, every segment through highdicom.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ils_pack import cohen_ils_dataset

from cxrground.datasets.pack import Pack
from cxrground.ils.export_coco import export_coco
from cxrground.ils.export_dicom_seg import export_dicom_seg
from cxrground.ils.export_hf import export_hf, ils_json_from_rows
from cxrground.io.dicom import write_dicom
from cxrground.io.image import read_image
from cxrground.io.masks import read_mask_png


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=40, help="noted COVID-19 rows to build from")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pack = Pack()
    work = args.out or Path(tempfile.mkdtemp(prefix="cxrground-exports-"))
    cohen_ils_dataset(pack, work, "masks", limit=args.limit)
    dataset, images = work / "dataset", pack.root / "cohen" / "images"
    data = json.loads((dataset / "mimic_ils_instruction_answer.json").read_text())
    studies = [(s, k, v) for s in data for k, v in data[s].items()]
    masks = {p["pair_id"]: read_mask_png(dataset / "lesion_mask" / p["seg_mask_path"])
             for _, _, v in studies for p in v["instruction_answer_pairs"]["positive_pairs"]}
    n_pairs = sum(len(v["instruction_answer_pairs"][k]) for _, _, v in studies
                  for k in ("positive_pairs", "negative_pairs"))
    sizes = [read_image(images / v["image_path"]).shape for _, _, v in studies]
    print(f"dataset: {len(studies)} studies, {n_pairs} pairs, {len(masks)} positive pairs, image sizes "
          f"{min(sizes)}..{max(sizes)}")
    source_mb = (sum((images / v["image_path"]).stat().st_size for _, _, v in studies) / 1e6
                 + size_mb(dataset / "lesion_mask"))

    import datasets

    t0 = time.perf_counter()
    export_hf(dataset, images, work / "hf", overwrite=True)
    t_hf = time.perf_counter() - t0
    splits = [s for s in data if data[s]]
    ds = datasets.load_dataset("parquet", data_files={s: str(work / "hf" / "data" / f"{s}-*.parquet")
                                                      for s in splits}, cache_dir=str(work / "hf_cache"))
    same_json = ils_json_from_rows({s: ds[s] for s in splits}) == {s: data[s] for s in splits}
    same_masks = all(np.array_equal(np.asarray(r["mask"]) >= 255, masks[r["pair_id"]])
                     for s in splits for r in ds[s] if r["polarity"] == "positive")
    print(f"hf (pair rows): {t_hf:.2f} s, {size_mb(work / 'hf'):.1f} MB ({size_mb(work / 'hf') / source_mb:.2f}x "
          f"the source images + masks, {source_mb:.1f} MB); JSON identical: {same_json}; masks identical: "
          f"{same_masks}")
    t0 = time.perf_counter()
    export_hf(dataset, images, work / "hf_study", rows="study", overwrite=True)
    t_study = time.perf_counter() - t0
    ds = datasets.load_dataset(str(work / "hf_study"), cache_dir=str(work / "hf_cache"))
    same_json = ils_json_from_rows({s: ds[s] for s in splits}) == {s: data[s] for s in splits}
    same_masks = all(np.array_equal(np.asarray(p["mask"]) >= 255, masks[p["pair_id"]])
                     for s in splits for r in ds[s] for p in r["pairs"] if p["mask"] is not None)
    print(f"hf (study rows): {t_study:.2f} s, {size_mb(work / 'hf_study'):.1f} MB "
          f"({size_mb(work / 'hf_study') / source_mb:.2f}x); JSON identical: {same_json}; masks identical: "
          f"{same_masks}")

    from pycocotools.coco import COCO

    t0 = time.perf_counter()
    counts = export_coco(dataset, work / "coco", overwrite=True)
    t_coco = time.perf_counter() - t0
    pairs = [json.loads(line) for line in (work / "coco" / "pairs.jsonl").read_text().splitlines()]
    cocos = {s: COCO(str(work / "coco" / "annotations" / f"instances_{s}.json")) for s in splits}
    same = all(np.array_equal(cocos[p["split"]].annToMask(cocos[p["split"]].loadAnns(p["annotation_id"])[0])
                              .astype(bool), masks[p["pair_id"]]) for p in pairs if p["annotation_id"] is not None)
    print(f"coco: {t_coco:.2f} s, {size_mb(work / 'coco'):.2f} MB, {counts['annotations']} annotations for "
          f"{len(masks)} positive pairs; annToMask identical: {same}")

    import highdicom as hd
    import pydicom

    dicom_root = work / "dicom_images"
    for _, _, v in studies:
        rel = Path(v["image_path"])
        write_dicom(dicom_root / rel.with_suffix(".dcm"), read_image(images / rel).pixels)
        v["image_path"] = str(rel.with_suffix(".dcm"))
    dicom_ds = work / "dataset_dicom"
    dicom_ds.mkdir(exist_ok=True)
    (dicom_ds / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    (dicom_ds / "lesion_mask").symlink_to(dataset / "lesion_mask")
    t0 = time.perf_counter()
    result = export_dicom_seg(dicom_ds, dicom_root, work / "seg", overwrite=True)
    t_seg = time.perf_counter() - t0
    identical = checked = 0
    for line in (work / "seg" / "dicom_seg.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["status"] != "written":
            continue
        uid = pydicom.dcmread(dicom_root / rec["image_path"], stop_before_pixels=True).SOPInstanceUID
        seg = hd.seg.segread(work / "seg" / rec["file"])
        numbers = [s["number"] for s in rec["segments"]]
        px = seg.get_pixels_by_source_instance(source_sop_instance_uids=[uid], segment_numbers=numbers,
                                               combine_segments=False)[0]
        for k, s in enumerate(rec["segments"]):
            checked += 1
            identical += all(np.array_equal(px[..., k].astype(bool), masks[p]) for p in s["pair_ids"])
    reasons = sorted({r for _, r in result["skipped"]})
    print(f"dicom-seg: {t_seg:.2f} s, {result['written']} objects, {result['segments']} segments, "
          f"{size_mb(work / 'seg'):.1f} MB; {len(result['skipped'])} studies skipped {reasons}; segments "
          f"identical to the masks: {identical}/{checked}")


if __name__ == "__main__":
    main()
