"""Mask frames (issue 12 item 5): the released 512² stretched layout, its export and its readers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cxrground.errors import InputError
from cxrground.evaluation.ils import evaluate_dataset, format_report
from cxrground.ils.frames import (
    FRAME_FILE,
    FRAME_TEXT,
    export_dataset,
    read_frame,
    reference_protocol_iou,
    stretch,
    to_native,
)
from cxrground.ils.predictions import prediction_line
from cxrground.io.masks import read_mask_png
from masks_helpers import rect


def _lesion(shape=(300, 250)) -> np.ndarray:
    m = np.zeros(shape, bool)
    m[120:220, 150:230] = True  # right of centre, where stretching shifts it most
    return m


def test_stretch_round_trip_is_close_and_shapes_are_checked():
    native = _lesion()
    released = stretch(native, (512, 512))
    assert released.shape == (512, 512)
    back = to_native(released, native.shape)
    assert back.shape == native.shape
    assert (back & native).sum() / (back | native).sum() > 0.97
    assert np.array_equal(stretch(native, native.shape), native)


def test_reference_protocol_scores_a_perfect_prediction_low_only_in_the_native_frame():
    native = _lesion()
    in_native_frame = reference_protocol_iou(native, native)
    in_released_frame = reference_protocol_iou(stretch(native, (512, 512)), native)
    assert in_released_frame > 0.97
    assert in_native_frame < 0.8
    square = rect((256, 256), (40, 100), (60, 120))
    assert reference_protocol_iou(square, square) > 0.99  # square images: both frames agree
    assert reference_protocol_iou(np.zeros((30, 20), bool), np.zeros((30, 20), bool)) == 1.0


@pytest.fixture(scope="module")
def ils_dir(tmp_path_factory):
    from click.testing import CliRunner

    from cxrground.cli import main

    root = tmp_path_factory.mktemp("frames")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "2"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0"])
    assert r.exit_code == 0, r.output
    return root / "ils"


def _perfect_predictions(ils, split, path):
    """Every pair predicted with its native GT mask (empty for negatives) and its GT answer."""
    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    lines = []
    for study in data[split].values():
        pairs = study["instruction_answer_pairs"]
        shape = None
        for p in pairs["positive_pairs"]:
            mask = read_mask_png(ils / "lesion_mask" / p["seg_mask_path"])
            shape = mask.shape
            lines.append(prediction_line(p["pair_id"], p["answer"], mask, "free"))
        for p in pairs["negative_pairs"]:
            lines.append(prediction_line(p["pair_id"], p["answer"], np.zeros(shape or (8, 8), bool), "free"))
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_export_released_frame_and_read_it_back(ils_dir, tmp_path):
    out = tmp_path / "released"
    counts = export_dataset(ils_dir, out)
    assert counts["masks"] > 0
    src_json = (ils_dir / "mimic_ils_instruction_answer.json").read_bytes()
    assert (out / "mimic_ils_instruction_answer.json").read_bytes() == src_json  # same JSON
    assert (out / "anatomy.jsonl").read_bytes() == (ils_dir / "anatomy.jsonl").read_bytes()  # percept build reads it
    data = json.loads(src_json)
    frame = read_frame(out)
    assert frame.frame == "released" and frame.size == 512
    for split in data.values():
        for study in split.values():
            hw = frame.native_of(study["image_path"])
            assert hw is not None
            for p in study["instruction_answer_pairs"]["positive_pairs"]:
                native = read_mask_png(ils_dir / "lesion_mask" / p["seg_mask_path"])
                released = read_mask_png(out / "lesion_mask" / p["seg_mask_path"])
                assert released.shape == (512, 512) and native.shape == hw
                assert np.array_equal(released, stretch(native, (512, 512)))
    card = (out / "card.md").read_text()
    assert FRAME_TEXT["released"].format(size=512) in card and FRAME_TEXT["native"] not in card
    assert FRAME_TEXT["native"] in (ils_dir / "card.md").read_text()
    # ils evaluate on the released export: masks mapped back to native with the record, no images needed
    split = next(s for s in ("test", "val", "train") if data.get(s) and any(
        st["instruction_answer_pairs"]["positive_pairs"] for st in data[s].values()))
    preds = _perfect_predictions(ils_dir, split, tmp_path / "perfect.jsonl")
    native_result = evaluate_dataset(ils_dir, preds, split=split, n_boot=0)
    released_result = evaluate_dataset(out, preds, split=split, n_boot=0)
    assert native_result["segmentation"]["gIoU"] == pytest.approx(1.0, abs=1e-4)
    assert native_result["mask_frame"] == "native" and released_result["mask_frame"] == "released"
    assert 0.9 < released_result["segmentation"]["gIoU"] < 1.0  # 512² quantisation, scored at native size
    assert released_result["n_pairs"] == native_result["n_pairs"]
    assert "GT mask frame: released" in format_report(released_result)
    # without its mask_frame.json: an error that points at --images, and with --images a report naming the sizes
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    (bare / "mask_frame.json").unlink()
    with pytest.raises(InputError, match="give --images to score at the native size"):
        evaluate_dataset(bare, preds, split=split, n_boot=0)
    scored = evaluate_dataset(bare, preds, split=split, n_boot=0, images_root=ils_dir.parent / "cohort" / "files")
    assert scored["mask_frame"] == "other sizes (512x512) resized to native, nearest"
    # back to the native frame from the record alone
    again = tmp_path / "native"
    export_dataset(out, again, frame="native")
    assert read_frame(again).frame == "native"
    p0 = next(p for st in data[split].values() for p in st["instruction_answer_pairs"]["positive_pairs"])
    assert read_mask_png(again / "lesion_mask" / p0["seg_mask_path"]).shape == \
        read_mask_png(ils_dir / "lesion_mask" / p0["seg_mask_path"]).shape


def test_export_cli_and_errors(ils_dir, tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main

    res = CliRunner().invoke(main, ["ils", "export", "--frame", "released", "--dataset", str(ils_dir),
                                    "--out", str(tmp_path / "r"), "--size", "256"])
    assert res.exit_code == 0, res.output
    assert "released frame" in res.output
    record = json.loads((tmp_path / "r" / FRAME_FILE).read_text())
    assert record["frame"] == "released" and record["mask_size"] == [256, 256]
    with pytest.raises(InputError, match="another folder"):
        export_dataset(ils_dir, ils_dir)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / FRAME_FILE).write_text(json.dumps({"frame": "released", "mask_size": [512, 300]}))
    with pytest.raises(InputError, match="square"):
        read_frame(tmp_path / "bad")
    # a released folder recording no native sizes (no frame record sizes, no anatomy.jsonl) and without images
    # cannot go back to native
    (tmp_path / "r" / FRAME_FILE).unlink()
    (tmp_path / "r" / "anatomy.jsonl").unlink()
    (tmp_path / "r" / FRAME_FILE).write_text(json.dumps({"frame": "released", "mask_size": [256, 256]}))
    with pytest.raises(InputError, match="native size"):
        export_dataset(tmp_path / "r", tmp_path / "n", frame="native")


def test_percept_build_maps_a_released_candidate_mask_to_the_image(tmp_path):
    from types import SimpleNamespace

    from cxrground.io.masks import write_mask_png
    from cxrground.percept.plans import _read_candidate

    native = _lesion()
    path = write_mask_png(tmp_path / "m.png", stretch(native, (512, 512)))
    got = _read_candidate(SimpleNamespace(mask_ref=str(path), cand=None), native.shape)
    assert got.shape == native.shape
    assert np.array_equal(got, to_native(stretch(native, (512, 512)), native.shape))
    assert (got & native).sum() / (got | native).sum() > 0.97


def test_read_native_mask_maps_released_masks_and_names_other_sizes(tmp_path):
    from cxrground.errors import MaskShapeError
    from cxrground.ils.frames import read_native_mask
    from cxrground.io.masks import write_mask_png

    native = np.zeros((300, 200), bool)
    native[100:200, 50:150] = True
    write_mask_png(tmp_path / "native.png", native)
    assert np.array_equal(read_native_mask(tmp_path / "native.png", (300, 200)), native)
    write_mask_png(tmp_path / "released.png", stretch(native, (512, 512)))
    back = read_native_mask(tmp_path / "released.png", (300, 200))
    assert (back & native).sum() / (back | native).sum() > 0.95
    write_mask_png(tmp_path / "small.png", stretch(native, (256, 256)))
    assert read_native_mask(tmp_path / "small.png", (300, 200), released_size=256).shape == (300, 200)
    with pytest.raises(MaskShapeError, match="expected"):
        read_native_mask(tmp_path / "small.png", (300, 200))


def test_released_export_of_dicom_films_warns_that_the_reference_loader_cannot_read_them(ils_dir, tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main

    def export(dataset, out):
        return CliRunner().invoke(main, ["ils", "export", "--frame", "released", "--dataset", str(dataset),
                                         "--out", str(out)])

    res = export(ils_dir, tmp_path / "jpg")
    assert res.exit_code == 0 and "warning" not in res.output, res.output
    assert "Warning" not in (tmp_path / "jpg" / "card.md").read_text()
    dcm = tmp_path / "dcm"
    shutil.copytree(ils_dir, dcm)
    path = dcm / "mimic_ils_instruction_answer.json"
    path.write_text(path.read_text().replace('.jpg"', '.dcm"'))
    res = export(dcm, tmp_path / "dcm512")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "warning:" in text and "cv2.imread" in text and "cannot read DICOM" in text, text
    card = " ".join((tmp_path / "dcm512" / "card.md").read_text().split())
    assert "**Warning:**" in card and "cv2.imread" in card
