"""ILS dataset exports to other tools: Hugging Face datasets, COCO (pycocotools) and DICOM-SEG (highdicom)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.ils.export import ExportRequest, export_request
from cxrground.ils.export_hf import ils_json_from_rows
from cxrground.io.masks import read_mask_png

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def ils(tmp_path_factory) -> tuple[Path, Path]:
    """(ILS folder, image root) of a 4-study synthetic cohort."""
    root = tmp_path_factory.mktemp("exports")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "2", "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0"])
    assert r.exit_code == 0, r.output
    return root / "ils", root / "cohort" / "files"


def _source(ils_dir: Path) -> dict:
    return json.loads((ils_dir / "mimic_ils_instruction_answer.json").read_text())


def _masks_by_pair(data: dict, ils_dir: Path) -> dict[str, np.ndarray]:
    return {p["pair_id"]: read_mask_png(ils_dir / "lesion_mask" / p["seg_mask_path"])
            for split in data.values() for s in split.values()
            for p in s["instruction_answer_pairs"]["positive_pairs"]}


def test_hf_export_round_trips_every_pair_and_mask(ils, tmp_path):
    ils_dir, images = ils
    out = tmp_path / "hf"
    r = CliRunner().invoke(main, ["ils", "export", "--format", "hf", "--dataset", str(ils_dir), "--images",
                                  str(images), "--out", str(out), "--shard-rows", "4", "--arrow"])
    assert r.exit_code == 0, r.output
    source = _source(ils_dir)
    n_pairs = {s: sum(len(v["instruction_answer_pairs"][k]) for v in source[s].values()
                      for k in ("positive_pairs", "negative_pairs")) for s in source}
    splits = [s for s, n in n_pairs.items() if n]
    files = {s: sorted(str(p) for p in (out / "data").glob(f"{s}-*.parquet")) for s in splits}
    assert len(files["train"]) == -(-n_pairs["train"] // 4)  # sharded by --shard-rows
    loaded = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))
    from_disk = datasets.load_from_disk(str(out / "arrow"))
    single = datasets.Dataset.from_parquet(files["train"], cache_dir=str(tmp_path / "cache"))
    assert len(single) == n_pairs["train"]
    masks = _masks_by_pair(source, ils_dir)
    for ds in (loaded, from_disk):
        assert {s: len(ds[s]) for s in splits} == {s: n_pairs[s] for s in splits}
        assert isinstance(ds["train"].features["image"], datasets.Image)
        assert isinstance(ds["train"].features["mask"], datasets.Image)
        back = ils_json_from_rows({s: ds[s] for s in splits})
        assert back == {s: source[s] for s in splits}  # every pair, every field, every answer
        for split in splits:
            for row in ds[split]:
                if row["polarity"] == "positive":
                    assert np.array_equal(np.asarray(row["mask"]) >= 255, masks[row["pair_id"]])
                    assert row["mask"].size == row["image"].size  # native frame
                else:
                    assert row["mask"] is None
    card = (out / "README.md").read_text()
    header = card.split("---")[1]
    assert "license:" in header and "configs:" in header and "dataset_info:" in header
    assert f"num_examples: {n_pairs['train']}" in header and "dtype: image" in header
    assert "## How it was built" in card


def test_hf_export_study_rows_hold_each_image_once(ils, tmp_path):
    ils_dir, images = ils
    out = tmp_path / "hf_study"
    export_request(ExportRequest(format="hf", hf_rows="study", dataset=ils_dir, images=images, out=out))
    source = _source(ils_dir)
    splits = [s for s in source if source[s]]
    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))  # the card's configs
    assert {s: len(ds[s]) for s in splits} == {s: len(source[s]) for s in splits}
    assert ils_json_from_rows({s: ds[s] for s in splits}) == {s: source[s] for s in splits}
    masks = _masks_by_pair(source, ils_dir)
    for split in splits:
        for study in ds[split]:
            for p in study["pairs"]:
                if p["mask"] is not None:
                    assert np.array_equal(np.asarray(p["mask"]) >= 255, masks[p["pair_id"]])
                    assert p["mask"].size == study["image"].size


def test_export_refuses_missing_images_and_its_own_folder(ils, tmp_path):
    with pytest.raises(ConfigError, match="needs --images"):
        export_request(ExportRequest(format="hf", dataset=ils[0], out=tmp_path / "x"))
    with pytest.raises(ConfigError, match="own folder"):
        export_request(ExportRequest(format="coco", dataset=ils[0], out=ils[0]))


def test_hf_export_refuses_a_mask_that_does_not_fit_its_film_and_names_the_frame_from_the_record(ils, tmp_path):
    import shutil

    from PIL import Image

    ils_dir, images = ils
    ok = tmp_path / "ok"
    r = _export("--format", "hf", "--dataset", str(ils_dir), "--images", str(images), "--out", str(ok))
    assert r.exit_code == 0, r.output
    assert "the PNG as stored, native frame;" in " ".join((ok / "README.md").read_text().split())
    study = next(s for split in _source(ils_dir).values() for s in split.values()
                 if s["instruction_answer_pairs"].get("positive_pairs"))
    mask = ils_dir / "lesion_mask" / study["instruction_answer_pairs"]["positive_pairs"][0]["seg_mask_path"]
    films = tmp_path / "files"
    shutil.copytree(images, films)
    film = films / study["image_path"]
    with Image.open(film) as im:
        native = (im.height, im.width)
        im.resize((im.width + 64, im.height + 70)).save(film)  # same path, another size
    for fmt in ("hf", "coco"):
        out = tmp_path / fmt
        r = _export("--format", fmt, "--dataset", str(ils_dir), "--images", str(films), "--out", str(out))
        assert r.exit_code == 1 and not out.exists(), r.output
        text = " ".join(r.output.split())
        assert str(mask) in text and f"mask is {native}" in text, text
        assert f"its image ({native[0] + 70}, {native[1] + 64})" in text, text


def test_coco_export_reads_back_with_pycocotools(ils, tmp_path):
    from pycocotools.coco import COCO

    from cxrground.vocab.lesions import LESIONS

    ils_dir, _ = ils
    out = tmp_path / "coco"
    r = CliRunner().invoke(main, ["ils", "export", "--format", "coco", "--dataset", str(ils_dir), "--out", str(out)])
    assert r.exit_code == 0, r.output
    source = _source(ils_dir)
    masks = _masks_by_pair(source, ils_dir)
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == sum(len(s["instruction_answer_pairs"][k]) for split in source.values()
                             for s in split.values() for k in ("positive_pairs", "negative_pairs"))
    checked = 0
    for split in [s for s in source if source[s]]:
        coco = COCO(str(out / "annotations" / f"instances_{split}.json"))
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(LESIONS)
        assert len(coco.getImgIds()) == len(source[split])
        for p in (p for p in pairs if p["split"] == split):
            original = source[split][p["study_key"]]["instruction_answer_pairs"]
            kept = {k: v for k, v in p.items() if k not in ("split", "study_key", "image_id", "annotation_id")}
            assert kept in original["positive_pairs"] + original["negative_pairs"]
            if p["annotation_id"] is None:
                assert p["seg"] is False
                continue
            ann = coco.loadAnns(p["annotation_id"])[0]
            img = coco.loadImgs(ann["image_id"])[0]
            assert img["file_name"] == source[split][p["study_key"]]["image_path"]
            mask = coco.annToMask(ann).astype(bool)
            assert np.array_equal(mask, masks[p["pair_id"]])
            assert (img["height"], img["width"]) == mask.shape
            assert coco.loadCats(ann["category_id"])[0]["name"] == p["target"]
            assert ann["area"] == mask.sum() and p["pair_id"] in ann["pair_ids"]
            ys, xs = np.nonzero(mask)
            assert ann["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
            checked += 1
    assert checked == len(masks)


@pytest.fixture(scope="module")
def dicom_ils(ils, tmp_path_factory) -> tuple[Path, Path]:
    """The dataset with its first two studies' images rewritten as DICOM (``write_dicom``), the rest as JPEG."""
    import shutil

    from cxrground.io.dicom import write_dicom
    from cxrground.io.image import read_image

    ils_dir, images = ils
    root = tmp_path_factory.mktemp("dicom_ils")
    shutil.copytree(ils_dir, root / "ils")
    shutil.copytree(images, root / "files")
    data = _source(ils_dir)
    studies = [s for split in data.values() for s in split.values()]
    for study in studies[:2]:
        rel = study["image_path"]
        dcm = str(Path(rel).with_suffix(".dcm"))
        write_dicom(root / "files" / dcm, read_image(images / rel).pixels)
        study["image_path"] = dcm
    (root / "ils" / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    return root / "ils", root / "files"


def test_dicom_seg_export_reads_back_into_our_masks(dicom_ils, tmp_path):
    import highdicom as hd
    import pydicom

    from cxrground.vocab.codes import LESION_CODES

    ils_dir, images = dicom_ils
    out = tmp_path / "seg"
    r = CliRunner().invoke(main, ["ils", "export", "--format", "dicom-seg", "--dataset", str(ils_dir), "--images",
                                  str(images), "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = _source(ils_dir)
    masks = _masks_by_pair(data, ils_dir)
    records = {json.loads(x)["study_key"]: json.loads(x) for x in (out / "dicom_seg.jsonl").read_text().splitlines()}
    assert len(records) == sum(len(s) for s in data.values())  # every study recorded, none dropped
    written = [r for r in records.values() if r["status"] == "written"]
    assert len(written) == 2 and len(list(out.glob("*.seg.dcm"))) == 2
    for rec in records.values():
        if rec["status"] == "skipped":
            assert "not DICOM" in rec["reason"] and rec["image_path"].endswith(".jpg")
    for rec in written:
        source = pydicom.dcmread(images / rec["image_path"])
        seg = hd.seg.segread(out / rec["file"])
        assert seg.Modality == "SEG" and seg.StudyInstanceUID == source.StudyInstanceUID
        ref = seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence[0]
        assert ref.ReferencedSOPInstanceUID == source.SOPInstanceUID == rec["source_sop_instance_uid"]
        numbers = [s["number"] for s in rec["segments"]]
        assert seg.get_segment_numbers() == numbers
        pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=[source.SOPInstanceUID],
                                                   segment_numbers=numbers, combine_segments=False)[0]
        for k, s in enumerate(rec["segments"]):
            desc = seg.get_segment_description(s["number"])
            scheme, value, _ = LESION_CODES[s["lesion"]]
            assert (desc.segmented_property_type.value, desc.segmented_property_type.scheme_designator) == (
                value, scheme)
            assert desc.segment_label == s["label"]
            for pair_id in s["pair_ids"]:
                assert np.array_equal(pixels[..., k].astype(bool), masks[pair_id])


@pytest.fixture(scope="module")
def spaced_dicom_ils(ils, tmp_path_factory) -> tuple[Path, Path]:
    """The dataset with its first study's image as a DICOM with PixelSpacing (no SliceThickness, as a radiograph
    has none) and its second's as a DICOM with ImagerPixelSpacing only."""
    import shutil

    import pydicom

    from cxrground.io.dicom import write_dicom
    from cxrground.io.image import read_image

    ils_dir, images = ils
    root = tmp_path_factory.mktemp("spaced_dicom_ils")
    shutil.copytree(ils_dir, root / "ils")
    shutil.copytree(images, root / "files")
    data = _source(ils_dir)
    studies = [s for split in data.values() for s in split.values()
               if s["instruction_answer_pairs"].get("positive_pairs")]
    for k, study in enumerate(studies[:2]):
        rel = study["image_path"]
        dcm = root / "files" / Path(rel).with_suffix(".dcm")
        write_dicom(dcm, read_image(images / rel).pixels, spacing=(0.3, 0.3) if k == 0 else None)
        if k == 1:
            ds = pydicom.dcmread(dcm)
            ds.ImagerPixelSpacing = [0.2, 0.25]
            ds.save_as(dcm, enforce_file_format=True)
        study["image_path"] = str(Path(rel).with_suffix(".dcm"))
    (root / "ils" / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    return root / "ils", root / "files"


def _export(*args: str):
    return CliRunner().invoke(main, ["ils", "export", *args])


def test_dicom_seg_of_a_radiograph_with_pixel_or_imager_spacing_reads_back_with_highdicom(spaced_dicom_ils,
                                                                                           tmp_path):
    import highdicom as hd
    import pydicom

    from cxrground.ils import export_dicom_seg

    ils_dir, images = spaced_dicom_ils
    out = tmp_path / "seg"
    r = _export("--format", "dicom-seg", "--dataset", str(ils_dir), "--images", str(images), "--out", str(out))
    assert r.exit_code == 0, r.output
    masks = _masks_by_pair(_source(ils_dir), ils_dir)
    records = [json.loads(x) for x in (out / "dicom_seg.jsonl").read_text().splitlines()]
    written = [rec for rec in records if rec["status"] == "written"]
    assert len(written) == 2
    spacings = []
    for rec in written:
        source = pydicom.dcmread(images / rec["image_path"])
        seg = hd.seg.segread(out / rec["file"])
        measures = seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
        spacings.append([float(v) for v in measures.PixelSpacing])
        assert float(measures.SliceThickness) == export_dicom_seg.SLICE_THICKNESS_MM
        numbers = [s["number"] for s in rec["segments"]]
        pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=[source.SOPInstanceUID],
                                                   segment_numbers=numbers, combine_segments=False)[0]
        for k, s in enumerate(rec["segments"]):
            for pair_id in s["pair_ids"]:
                assert np.array_equal(pixels[..., k].astype(bool), masks[pair_id])
    assert sorted(spacings) == [[0.2, 0.25], [0.3, 0.3]]


def test_dicom_seg_export_writes_the_same_bytes_again(spaced_dicom_ils, tmp_path):
    ils_dir, images = spaced_dicom_ils
    for name in ("a", "b"):
        r = _export("--format", "dicom-seg", "--dataset", str(ils_dir), "--images", str(images), "--out",
                    str(tmp_path / name))
        assert r.exit_code == 0, r.output
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(files) == 3
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_dicom_seg_with_nothing_written_fails_and_a_missing_mask_is_named(spaced_dicom_ils, ils, tmp_path):
    import shutil

    ils_dir, images = spaced_dicom_ils
    out = tmp_path / "none"
    r = _export("--format", "dicom-seg", "--dataset", str(ils_dir), "--images", str(ils[1]), "--out", str(out))
    assert r.exit_code == 1 and "no DICOM Segmentation written" in r.output and not out.exists()
    broken = tmp_path / "broken"
    shutil.copytree(ils_dir, broken)
    study = next(s for split in _source(broken).values() for s in split.values() if s["image_path"].endswith(".dcm"))
    mask = broken / "lesion_mask" / study["instruction_answer_pairs"]["positive_pairs"][0]["seg_mask_path"]
    mask.unlink()
    out = tmp_path / "seg"
    r = _export("--format", "dicom-seg", "--dataset", str(broken), "--images", str(images), "--out", str(out))
    assert r.exit_code == 0, r.output
    reasons = [json.loads(x).get("reason", "") for x in (out / "dicom_seg.jsonl").read_text().splitlines()]
    assert any(str(mask) in reason for reason in reasons), reasons


def test_dicom_seg_records_an_unreadable_source_and_reads_one_without_the_part10_header(spaced_dicom_ils, tmp_path):
    import shutil

    import highdicom as hd
    import pydicom

    ils_dir, images = spaced_dicom_ils
    files = tmp_path / "files"
    shutil.copytree(images, files)
    dicoms = sorted(s["image_path"] for split in _source(ils_dir).values() for s in split.values()
                    if s["image_path"].endswith(".dcm"))
    junk, bare = files / dicoms[0], files / dicoms[1]
    junk.write_bytes(b"junk")
    ds = pydicom.dcmread(bare)
    pixels = ds.pixel_array
    del ds.file_meta
    ds.preamble = None
    ds.save_as(bare, enforce_file_format=False)  # a dataset without preamble, 'DICM' and file meta
    with pytest.raises(pydicom.errors.InvalidDicomError):
        pydicom.dcmread(bare)
    out = tmp_path / "seg"
    r = _export("--format", "dicom-seg", "--dataset", str(ils_dir), "--images", str(files), "--out", str(out))
    assert r.exit_code == 0, r.output
    records = {x["image_path"]: x for x in map(json.loads, (out / "dicom_seg.jsonl").read_text().splitlines())}
    assert records[dicoms[0]]["status"] == "skipped" and str(junk) in records[dicoms[0]]["reason"]
    assert "not a DICOM file" in records[dicoms[0]]["reason"]
    written = records[dicoms[1]]
    assert written["status"] == "written", written
    seg = hd.seg.segread(out / written["file"])
    got = seg.get_pixels_by_source_instance(source_sop_instance_uids=[written["source_sop_instance_uid"]])
    assert got.shape[1:3] == pixels.shape


#: Per format: the options after --dataset, and a file an earlier export of that format may hold that the next
#: one does not write (it must not survive --overwrite).
_FORMATS = {"mimic-ils": ([], "lesion_mask/old/old_edema_0.png"), "hf": (["--arrow"], "arrow/dataset_dict.json"),
            "coco": ([], "annotations/instances_old.json"), "dicom-seg": ([], "old.seg.dcm")}


@pytest.mark.parametrize("fmt", list(_FORMATS))
def test_ils_export_refuses_a_non_empty_out_and_overwrite_replaces_an_earlier_export(fmt, spaced_dicom_ils,
                                                                                      tmp_path):
    ils_dir, images = spaced_dicom_ils
    first, stale = _FORMATS[fmt]
    common = ["--format", fmt, "--dataset", str(ils_dir), "--images", str(images)]
    out = tmp_path / "out"
    assert _export(*common, *first, "--out", str(out)).exit_code == 0
    (out / stale).parent.mkdir(parents=True, exist_ok=True)
    (out / stale).touch()
    r = _export(*common, "--out", str(out))
    assert r.exit_code == 1 and "not empty" in r.output and str(out) in r.output and "--overwrite" in r.output
    assert (out / stale).exists()
    r = _export(*common, "--out", str(out), "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (out / stale).exists() and not (out / "arrow").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left beside it
    (out / "keep.txt").write_text("mine")
    r = _export(*common, "--out", str(out), "--overwrite")
    assert r.exit_code == 1 and "keep.txt" in r.output and (out / "keep.txt").read_text() == "mine"


def test_a_failed_mimic_ils_export_leaves_out_as_it_was(ils, tmp_path):
    import shutil

    ils_dir, _ = ils
    broken = tmp_path / "broken"
    shutil.copytree(ils_dir, broken)
    pair = next(p for split in _source(broken).values() for s in split.values()
                for p in s["instruction_answer_pairs"]["positive_pairs"])
    (broken / "lesion_mask" / pair["seg_mask_path"]).unlink()
    out = tmp_path / "released"
    r = _export("--frame", "released", "--dataset", str(broken), "--out", str(out))
    assert r.exit_code == 1 and "mask" in r.output and not out.exists()
    assert _export("--frame", "released", "--dataset", str(ils_dir), "--out", str(out)).exit_code == 0
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    r = _export("--frame", "released", "--dataset", str(broken), "--out", str(out), "--overwrite")
    assert r.exit_code == 1 and sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "released"]


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_downloaded_mimic_ils_without_a_frame_record_exports_like_a_recorded_released_one(spaced_dicom_ils,
                                                                                             tmp_path):
    from cxrground.io.image import read_image

    ils_dir, images = spaced_dicom_ils
    recorded = tmp_path / "recorded" / "ils512"  # one name: the coco export's description holds it
    assert _export("--frame", "released", "--dataset", str(ils_dir), "--images", str(images), "--out",
                   str(recorded)).exit_code == 0
    download = tmp_path / "download" / "ils512"  # MIMIC-ILS as published: 512x512 masks, no mask_frame.json
    shutil.copytree(recorded, download)
    (download / "mask_frame.json").unlink()
    (download / "anatomy.jsonl").unlink()  # it records no film sizes either
    data = _source(download)
    assert any(read_image(images / s["image_path"]).shape != (512, 512)
               for split in data.values() for s in split.values() if s["instruction_answer_pairs"]["positive_pairs"])
    for fmt, options, compared in (("coco", [], None), ("mimic-ils", ["--frame", "native"], "lesion_mask"),
                                   ("dicom-seg", [], None)):
        outs = []
        for source in (recorded, download):
            out = tmp_path / f"{fmt}_{source.parent.name}"
            r = _export("--format", fmt, *options, "--dataset", str(source), "--images", str(images), "--out",
                        str(out))
            assert r.exit_code == 0, r.output
            outs.append(_tree(out / compared) if compared else _tree(out))
        assert outs[0] == outs[1], fmt  # the same masks on each image's own grid
    assert any(name.endswith(".seg.dcm") for name in outs[1])
    cards = {}
    for source in (ils_dir, download):
        out = tmp_path / f"hf_{source.parent.name}"
        assert _export("--format", "hf", "--dataset", str(source), "--images", str(images), "--out",
                       str(out)).exit_code == 0
        cards[source.parent.name] = (out / "README.md").read_text()
    assert "as stored, native frame;" in cards[ils_dir.parent.name]
    assert "as stored, released frame, 512x512;" in cards["download"] and "native frame" not in cards["download"]
    # without --images nothing tells a download's film sizes: the 512x512 masks are no size to take for them
    r = _export("--format", "coco", "--dataset", str(download), "--out", str(tmp_path / "coco_no_images"))
    assert r.exit_code != 0 and "give --images" in r.output and "Traceback" not in r.output
    # a recorded released frame: a mask of another side is refused, not stretched
    mask = next(recorded.glob("lesion_mask/*/*.png"))
    from cxrground.io.masks import write_mask_png

    write_mask_png(mask, np.ones((300, 200), bool))
    r = _export("--format", "coco", "--dataset", str(recorded), "--images", str(images), "--out",
                str(tmp_path / "coco_bad_side"))
    assert r.exit_code != 0 and "(300, 200)" in r.output, r.output


def test_coco_export_gives_an_empty_mask_no_annotation_and_marks_its_pairs(ils, tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from cxrground.io.masks import write_mask_png

    ils_dir, _ = ils
    dataset = tmp_path / "ils"
    shutil.copytree(ils_dir, dataset)
    source = _source(dataset)
    split, study = next((sp, s) for sp, studies in source.items() for s in studies.values()
                        if s["instruction_answer_pairs"]["positive_pairs"])
    emptied = study["instruction_answer_pairs"]["positive_pairs"][0]["seg_mask_path"]
    path = dataset / "lesion_mask" / emptied
    write_mask_png(path, np.zeros_like(read_mask_png(path)))
    out = tmp_path / "coco"
    r = _export("--format", "coco", "--dataset", str(dataset), "--out", str(out))
    assert r.exit_code == 0 and "(1 empty masks have none)" in r.output, r.output
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    marked = [p for p in pairs if p.get("no_annotation")]
    assert marked and all(p["seg_mask_path"] == emptied and p["annotation_id"] is None for p in marked)
    assert {p["no_annotation"] for p in marked} == {"empty mask"}
    assert len(pairs) == sum(len(s["instruction_answer_pairs"][k]) for sp in source.values()
                             for s in sp.values() for k in ("positive_pairs", "negative_pairs"))
    coco = COCO(str(out / "annotations" / f"instances_{split}.json"))
    anns = coco.loadAnns(coco.getAnnIds())
    assert anns and all(a["area"] > 0 and a["bbox"][2] > 0 for a in anns)
    assert emptied not in {a["seg_mask_path"] for a in anns}
    results = coco.loadRes([{"image_id": a["image_id"], "category_id": a["category_id"],
                             "segmentation": a["segmentation"], "score": 1.0} for a in anns])
    scored = COCOeval(coco, results, "segm")
    scored.evaluate()
    scored.accumulate()
    scored.summarize()
    assert scored.stats[0] == pytest.approx(1.0)  # the ground truth scores itself perfectly


def test_hf_pair_rows_leave_out_a_study_without_pairs_as_the_card_says_and_study_rows_keep_it(ils, tmp_path):
    ils_dir, images = ils
    dataset = tmp_path / "ils"
    shutil.copytree(ils_dir, dataset)
    source = _source(dataset)
    split, key = next((sp, k) for sp, studies in source.items() for k in studies)
    source[split][key]["instruction_answer_pairs"] = {"positive_pairs": [], "negative_pairs": []}
    (dataset / "mimic_ils_instruction_answer.json").write_text(json.dumps(source))
    splits = [s for s in source if source[s]]
    back = {}
    for rows in ("pair", "study"):
        out = tmp_path / rows
        export_request(ExportRequest(format="hf", hf_rows=rows, dataset=dataset, images=images, out=out))
        ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
        back[rows] = ils_json_from_rows({s: ds[s] for s in splits})
        card = (out / "README.md").read_text()
        assert ("A study without pairs has no row" in card) == (rows == "pair")
    assert back["study"] == {s: source[s] for s in splits}
    without = {s: {k: v for k, v in source[s].items() if k != key} for s in splits}
    assert back["pair"] == without
