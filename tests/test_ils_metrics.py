"""ILS evaluation (ILS.md §15): segmentation metrics, text parsing, predictions, whole-dataset runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.errors import MaskShapeError
from cxrground.evaluation.bootstrap import bootstrap_ci
from cxrground.evaluation.ils import (
    NOT_EXTRACTED,
    SegmentationMetric,
    TextAccuracyMetric,
    clean_answer,
    evaluate_dataset,
    format_report,
    parse_answer,
    question_type,
    sample_iou,
)
from cxrground.ils.predictions import Prediction, load_predictions
from cxrground.ils.schema import validate_dataset
from cxrground.io.masks import encode_rle, write_mask_png
from cxrground.vocab import ils_templates as T
from masks_helpers import rect

SHAPE = (20, 30)

# --- segmentation --------------------------------------------------------------------------------


def test_sample_iou_both_empty_is_one_and_formula():
    assert sample_iou(0, 0) == 1.0
    assert sample_iou(4, 16) == pytest.approx(4 / (16 + 1e-5))


def test_known_iou_values_and_cious_differ_on_unequal_sizes():
    m = SegmentationMetric(n_boot=0)
    small_gt = rect(SHAPE, (0, 3), (0, 3))  # 16 px
    small_pred = rect(SHAPE, (0, 1), (0, 1))  # 4 px inside -> IoU 0.25
    big = rect(SHAPE, (5, 14), (5, 14))  # 100 px, exact -> IoU 1
    assert m.update("a", small_pred, small_gt, "pneumonia", "basic") == pytest.approx(0.25, abs=1e-6)
    assert m.update("b", big, big, "effusion", "global") == pytest.approx(1.0, abs=1e-6)
    r = m.aggregate()
    assert r["gIoU"] == pytest.approx((0.25 + 1.0) / 2, abs=1e-6)
    assert r["cIoU"] == pytest.approx(104 / 116, abs=1e-6)
    assert r["gIoU"] != pytest.approx(r["cIoU"], abs=1e-3)
    assert r["Dice"] == pytest.approx((2 * 4 / 20 + 1.0) / 2)
    assert r["per_lesion"]["pneumonia"]["positive"]["gIoU"] == pytest.approx(0.25, abs=1e-6)
    assert r["per_type"]["global"]["positive"]["n"] == 1
    assert r["N-Acc"] is None and r["n_negative"] == 0


def test_empty_prediction_on_positive_scores_zero_and_false_empty():
    m = SegmentationMetric(n_boot=0)
    gt = rect(SHAPE, (2, 5), (2, 5))
    assert m.update("a", np.zeros(SHAPE, bool), gt, "edema", "basic") == 0.0
    r = m.aggregate()
    assert r["gIoU"] == 0.0 and r["cIoU"] == 0.0 and r["false_empty_ratio"] == 1.0


def test_n_acc_counts_negatives_with_zero_pixels():
    m = SegmentationMetric(n_boot=0)
    empty = np.zeros(SHAPE, bool)
    assert m.update("n1", empty, empty, "edema", "global") == 1.0
    m.update("n2", rect(SHAPE, (0, 0), (0, 0)), empty, "edema", "global")
    m.update("n3", empty, empty, "opacity", "lesion_inference")
    r = m.aggregate()
    assert r["N-Acc"] == pytest.approx(2 / 3)
    assert r["per_lesion"]["edema"]["negative"]["N-Acc"] == 0.5
    assert r["per_type"]["lesion_inference"]["negative"]["N-Acc"] == 1.0
    assert r["gIoU"] is None


def test_missing_predictions_count_wrong_and_are_listed():
    m = SegmentationMetric(n_boot=0)
    gt = rect(SHAPE, (2, 5), (2, 5))
    m.update("pos", None, gt, "edema", "basic")
    m.update("neg", None, np.zeros(SHAPE, bool), "edema", "basic")
    r = m.aggregate()
    assert r["gIoU"] == 0.0 and r["cIoU"] == 0.0 and r["N-Acc"] == 0.0
    assert r["missing"] == ["pos", "neg"] and r["n_missing"] == 2
    assert r["n_positive"] == 1 and r["n_negative"] == 1  # never dropped from a denominator


def test_shape_mismatch_names_the_pair():
    m = SegmentationMetric(n_boot=0)
    with pytest.raises(MaskShapeError, match="pair p7"):
        m.update("p7", np.zeros((5, 5), bool), np.zeros(SHAPE, bool), "edema", "basic")
    pred = Prediction("p8", "[SEG]", rle=encode_rle(np.zeros((10, 10), bool)))
    with pytest.raises(MaskShapeError, match="pair p8"):
        pred.mask_array(SHAPE)


def test_bootstrap_contains_point_and_is_deterministic():
    rng = np.random.default_rng(1)
    m1, m2, m3 = (SegmentationMetric(n_boot=300, seed=s) for s in (5, 5, 6))
    for i in range(40):
        gt = rect(SHAPE, (0, 9), (0, 9))
        k = int(rng.integers(0, 10))
        pred = rect(SHAPE, (0, k), (0, 9))
        neg_pred = rect(SHAPE, (0, 0), (0, 0)) if i % 3 == 0 else np.zeros(SHAPE, bool)
        for m in (m1, m2, m3):
            m.update(f"p{i}", pred, gt, "edema", "basic")
            m.update(f"n{i}", neg_pred, np.zeros(SHAPE, bool), "edema", "basic")
    r1, r2, r3 = m1.aggregate(), m2.aggregate(), m3.aggregate()
    for key in ("gIoU", "cIoU", "N-Acc"):
        lo, hi = r1["ci"][key]
        assert lo <= r1[key] <= hi and lo < hi
    assert r1["ci"] == r2["ci"]
    assert r1["ci"] != r3["ci"]
    assert bootstrap_ci(np.array([]), lambda v: v.mean(axis=1)) is None


# --- text ----------------------------------------------------------------------------------------

CARDIO_Q = T.instruction("global", "cardiomegaly")
LI_Q = T.instruction("lesion_inference", "pneumonia", ["right lung"])


def test_question_type_from_instruction():
    assert question_type(T.instruction("basic", "pneumonia", ["right lung"])) == "basic"
    assert question_type(T.instruction("global", "opacity")) == "global"
    assert question_type(LI_Q) == "lesion_inference"
    assert question_type("Describe the image.") == "unknown"


def test_clean_answer_removes_wrapping_newlines_and_double_spaces():
    raw = T.llava_prompt("Segment the edema.") + " [SEG] There is \nno  edema.</s><unk>"
    assert clean_answer(raw) == "[SEG] There is no edema."
    # ILS.md §15.2 (and the reference's .replace("\n", "")): newlines are removed, not turned into spaces
    assert clean_answer(" [SEG] There is\r\nno edema in the right\nlung.") == "[SEG] There isno edema in the rightlung."


def test_parse_basic():
    q = "basic"
    neg = T.negative_answer("basic", "atelectasis", ["left lung base"])
    assert parse_answer(neg, q).astuple() == ("basic", "atelectasis", "left lung base", "absent")
    assert parse_answer(neg + "..", q).location == "left lung base"
    assert parse_answer(T.positive_answer("basic", "pneumonia"), q).astuple() == (
        "basic", NOT_EXTRACTED, NOT_EXTRACTED, "present")


def test_parse_global():
    q = "global"
    pos = T.positive_answer("global", "opacity", ["right lung base", "left lung base"])
    assert parse_answer(pos, q).astuple() == ("global", NOT_EXTRACTED, "right lung base and left lung base", "present")
    assert parse_answer(T.negative_answer("global", "edema"), q).astuple() == ("global", "edema", "none", "absent")
    cardio = parse_answer(T.positive_answer("global", "cardiomegaly"), q)
    assert cardio.astuple() == ("global", NOT_EXTRACTED, NOT_EXTRACTED, NOT_EXTRACTED)


def test_parse_lesion_inference():
    q = "lesion_inference"
    d = parse_answer(T.positive_answer(q, "pneumonia", certainty="definitive"), q)
    t = parse_answer(T.positive_answer(q, "edema", certainty="tentative"), q)
    n = parse_answer(T.negative_answer(q, "opacity", ["right lung"]), q)
    assert (d.target, d.presence) == ("pneumonia", "definite")
    assert (t.target, t.presence) == ("edema", "tentative")
    assert (n.target, n.presence) == ("opacity in the right lung", "absent")
    # §15.2's pattern is the phrase alone, wherever it occurs: a reply without "It is" / "There" is read too
    short = parse_answer("[SEG] Highly suggestive of pneumonia.", q)
    assert (short.target, short.presence) == ("pneumonia", "definite")
    assert parse_answer("[SEG] Possibly reflects edema", q).presence == "tentative"
    assert parse_answer("[SEG] It is not pneumonia.", q).presence == NOT_EXTRACTED  # "is no" needs the space


def test_cardiomegaly_seg_only_answers_match():
    m = TextAccuracyMetric()
    gt = T.positive_answer("global", "cardiomegaly")
    assert m.update("c", CARDIO_Q, gt, "[SEG]", "cardiomegaly")
    r = m.aggregate()
    assert r["per_type"]["global"]["positive"]["accuracy"] == 1.0
    assert r["per_lesion"]["cardiomegaly"]["overall"]["accuracy"] == 1.0


def test_global_exact_vs_lenient():
    m = TextAccuracyMetric()
    q = T.instruction("global", "effusion")
    gt = T.positive_answer("global", "effusion", ["right lung base"])
    assert not m.update("g1", q, gt, T.positive_answer("global", "effusion", ["right lung"]), "effusion")
    assert not m.update("g2", q, gt, T.positive_answer("global", "effusion", ["left lung"]), "effusion")
    assert m.update("g3", q, gt, gt, "effusion")
    pos = m.aggregate()["per_type"]["global"]["positive"]
    assert pos["accuracy"] == pytest.approx(1 / 3)
    assert pos["accuracy_lenient"] == pytest.approx(2 / 3)
    assert pos["accuracy_unordered"] == pytest.approx(1 / 3)


def test_global_unordered_variant_ignores_label_order_only():
    m = TextAccuracyMetric()
    q = T.instruction("global", "edema")
    gt = T.positive_answer("global", "edema", ["left lung base", "right mid zone lung", "right lung base"])
    swapped = T.positive_answer("global", "edema", ["right lung base", "left lung base", "right mid zone lung"])
    fewer = T.positive_answer("global", "edema", ["right lung base", "left lung base"])
    assert not m.update("u1", q, gt, swapped, "edema")  # §15.2 headline: the exact string
    assert not m.update("u2", q, gt, fewer, "edema")
    assert m.update("u3", q, gt, gt, "edema")
    pos = m.aggregate()["per_type"]["global"]["positive"]
    assert pos["accuracy"] == pytest.approx(1 / 3)
    assert pos["accuracy_unordered"] == pytest.approx(2 / 3)  # swapped counts, a missing label does not


def test_lesion_inference_lesion_only_vs_strict():
    m = TextAccuracyMetric()
    gt = T.positive_answer("lesion_inference", "pneumonia", certainty="definitive")
    assert m.update("l1", LI_Q, gt, T.positive_answer("lesion_inference", "pneumonia", certainty="tentative"),
                    "pneumonia")
    assert not m.update("l2", LI_Q, gt, T.positive_answer("lesion_inference", "edema"), "pneumonia")
    assert not m.update("l3", LI_Q, gt, T.negative_answer("lesion_inference", "opacity", ["right lung"]),
                        "pneumonia")
    assert m.update("l4", LI_Q, gt, gt, "pneumonia")
    neg = T.negative_answer("lesion_inference", "opacity", ["right lung"])
    assert m.update("l5", LI_Q, neg, neg, "opacity")
    assert not m.update("l6", LI_Q, neg, T.negative_answer("lesion_inference", "opacity", ["left lung"]), "opacity")
    assert not m.update("l7", LI_Q, neg, None, "opacity")
    r = m.aggregate()
    pos = r["per_type"]["lesion_inference"]["positive"]
    assert pos["n"] == 4 and pos["accuracy"] == 0.5 and pos["accuracy_strict"] == 0.25
    assert r["per_type"]["lesion_inference"]["negative"]["accuracy"] == pytest.approx(1 / 3)
    assert r["missing"] == ["l7"]


def test_basic_negative_needs_matching_location():
    m = TextAccuracyMetric()
    q = T.instruction("basic", "edema", ["left lung"])
    gt = T.negative_answer("basic", "edema", ["left lung"])
    assert m.update("b1", q, gt, gt.replace(".", "..."), "edema")
    assert not m.update("b2", q, gt, T.negative_answer("basic", "edema", ["right lung"]), "edema")
    assert not m.update("b3", q, gt, "[SEG]", "edema")
    assert m.update("b4", q, "[SEG]", "[SEG] something else", "edema")  # positive: "present" either way
    r = m.aggregate()
    assert r["negative"]["accuracy"] == pytest.approx(1 / 3) and r["positive"]["accuracy"] == 1.0


# --- whole-dataset runs --------------------------------------------------------------------------


def _masks():
    lung = rect(SHAPE, (4, 15), (3, 12))
    heart = rect(SHAPE, (10, 17), (11, 20))
    return lung, heart


def _make_dataset(root, gt_shape=SHAPE):
    lung, heart = _masks()
    key = "s1"
    mdir = root / "lesion_mask" / key
    paths = {}
    for name, m in (("pneumonia_0", lung), ("cardiomegaly_1", heart)):
        if gt_shape != SHAPE:
            from PIL import Image

            small = Image.fromarray(m.astype(np.uint8) * 255).resize(gt_shape[::-1], Image.Resampling.NEAREST)
            m = np.asarray(small) > 0
        write_mask_png(mdir / f"{key}_{name}.png", m)
        paths[name] = f"{key}/{key}_{name}.png"
    loc = ["right lung"]
    common = {"reported_location": loc, "grounded_location": loc, "sent_idx": "1", "seg": True}
    pos = [
        {"pair_id": f"{key}_positive_0", "instruction": T.instruction("basic", "pneumonia", loc),
         "answer": T.positive_answer("basic", "pneumonia", loc), "type": "basic", "target": "pneumonia",
         "seg_mask_path": paths["pneumonia_0"], **common},
        {"pair_id": f"{key}_positive_1", "instruction": T.instruction("global", "pneumonia"),
         "answer": T.positive_answer("global", "pneumonia", loc), "type": "global", "target": "pneumonia",
         "seg_mask_path": paths["pneumonia_0"], **common},
        {"pair_id": f"{key}_positive_2", "instruction": T.instruction("lesion_inference", "pneumonia", loc),
         "answer": T.positive_answer("lesion_inference", "pneumonia", loc, "tentative"),
         "type": "lesion_inference", "target": "pneumonia", "seg_mask_path": paths["pneumonia_0"], **common},
        {"pair_id": f"{key}_positive_3", "instruction": T.instruction("global", "cardiomegaly"),
         "answer": T.positive_answer("global", "cardiomegaly"), "type": "global", "target": "cardiomegaly",
         "seg_mask_path": paths["cardiomegaly_1"], **{**common, "reported_location": ["heart"],
                                                       "grounded_location": ["heart"]}},
    ]
    neg_specs = [("basic", "atelectasis", ["left lung base"]), ("global", "edema", ["lung"]),
                 ("lesion_inference", "opacity", ["left lung"])]
    neg = [
        {"pair_id": f"{key}_negative_{i}", "instruction": T.instruction(kind, target, where),
         "answer": T.negative_answer(kind, target, where), "type": kind, "target": target,
         "location": where, "seg": False, "seg_mask_path": None}
        for i, (kind, target, where) in enumerate(neg_specs)
    ]
    study = {"subject_id": "p1", "dicom_id": "d1", "image_path": "p1/s1/d1.png", "section_name": "findings",
             "section_content": "(1) Right lung pneumonia.",
             "instruction_answer_pairs": {"positive_pairs": pos, "negative_pairs": neg}}
    data = {"train": {}, "val": {}, "test": {key: study}}
    (root / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    assert validate_dataset(data, root / "lesion_mask") == []
    gt = {p["pair_id"]: (lung if "pneumonia" in p["seg_mask_path"] else heart) for p in pos}
    gt.update({p["pair_id"]: np.zeros(SHAPE, bool) for p in neg})
    answers = {p["pair_id"]: p["answer"] for p in pos + neg}
    return gt, answers


def _write_preds(path, masks, answers, as_png=False, skip=()):
    lines = []
    for pid, mask in masks.items():
        if pid in skip:
            continue
        entry = {"pair_id": pid, "answer": answers[pid]}
        if as_png:
            write_mask_png(path.parent / "pm" / f"{pid}.png", mask)
            entry["mask_path"] = f"pm/{pid}.png"
        else:
            entry["mask"] = encode_rle(mask)
        lines.append(json.dumps(entry))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("as_png", [False, True])
def test_oracle_run_is_perfect(tmp_path, as_png):
    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers, as_png=as_png)
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=50)
    seg = r["segmentation"]
    assert seg["gIoU"] == pytest.approx(1.0, abs=1e-5)
    assert seg["cIoU"] == pytest.approx(1.0, abs=1e-5)
    assert seg["N-Acc"] == 1.0 and seg["Dice"] == 1.0
    assert r["text"]["total"]["accuracy"] == 1.0 and r["text"]["total_strict"]["accuracy"] == 1.0
    assert r["n_pairs"] == 7 and r["missing"] == []
    assert r["counts"] == {"basic": {"positive": 1, "negative": 1}, "global": {"positive": 2, "negative": 1},
                           "lesion_inference": {"positive": 1, "negative": 1}}
    report = format_report(r)
    assert "gIoU" in report and "100.0" in report and "evaluated pairs: 7" in report


def test_all_empty_predictions(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    empty = {pid: np.zeros(SHAPE, bool) for pid in gt}
    pred = _write_preds(tmp_path / "preds.jsonl", empty, answers)
    seg = evaluate_dataset(tmp_path / "ds", pred, n_boot=20)["segmentation"]
    assert seg["gIoU"] == 0.0 and seg["cIoU"] == 0.0 and seg["N-Acc"] == 1.0 and seg["false_empty_ratio"] == 1.0


def test_missing_pairs_listed_and_wrong(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers, skip=("s1_positive_0", "s1_negative_1"))
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=0)
    assert r["missing"] == ["s1_positive_0", "s1_negative_1"]
    seg = r["segmentation"]
    assert seg["n_positive"] == 4 and seg["n_negative"] == 3
    assert seg["gIoU"] == pytest.approx(0.75, abs=1e-5) and seg["N-Acc"] == pytest.approx(2 / 3)
    assert r["text"]["total"]["accuracy"] == pytest.approx(5 / 7)
    assert "s1_positive_0" in format_report(r)


def test_limit_is_explicit(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=0, limit=2)
    assert r["n_pairs"] == 2 and r["limit"] == 2 and "first 2" in format_report(r)


def test_wrong_size_prediction_raises_naming_pair(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    gt["s1_negative_2"] = np.zeros((8, 8), bool)
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    with pytest.raises(MaskShapeError, match="s1_negative_2"):
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)


def test_released_size_gt_resized_to_native_image(tmp_path):
    from cxrground.io.image import write_image

    gt, answers = _make_dataset(tmp_path / "ds", gt_shape=(40, 40))
    write_image(tmp_path / "img" / "p1/s1/d1.png", np.zeros(SHAPE, np.uint8))
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=0, images_root=tmp_path / "img")
    assert r["segmentation"]["gIoU"] > 0.9
    with pytest.raises(MaskShapeError):  # without the native size, the 20x30 prediction is the wrong size
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)


def test_load_predictions_rejects_duplicates(tmp_path):
    from cxrground.errors import InputError

    p = tmp_path / "p.jsonl"
    p.write_text('{"pair_id": "a", "answer": "[SEG]"}\n\n{"pair_id": "a"}\n')
    with pytest.raises(InputError, match="duplicate"):
        load_predictions(p)
    p.write_text('{"pair_id": "a", "answer": "[SEG]"}\n')
    got = load_predictions(p)
    assert got["a"].answer == "[SEG]" and not got["a"].has_mask


def test_cli_evaluate(tmp_path):
    from cxrground.cli.ils_cmds import ils
    from cxrground.cli.ils_model_cmds import evaluate

    assert ils.commands["evaluate"] is evaluate
    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(ils, ["evaluate", "--dataset", str(tmp_path / "ds"), "--predictions", str(pred),
                                   "--out", str(out), "--bootstrap", "10"])
    assert res.exit_code == 0, res.output
    assert "# ILS evaluation" in res.output
    assert json.loads(out.read_text())["segmentation"]["N-Acc"] == 1.0


def _rle_line(pid: str, answer: str, rle: dict | None) -> str:
    return json.dumps({"pair_id": pid, "answer": answer, "mask": rle})


def _with_line(tmp_path, gt, answers, pid: str, rle) -> tuple:
    """The oracle predictions with pair ``pid``'s mask replaced by ``rle``; returns (file, its line number)."""
    path = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if json.loads(line)["pair_id"] == pid)
    lines[n] = _rle_line(pid, answers[pid], rle)
    path.write_text("\n".join(lines) + "\n")
    return path, n + 1


def test_declared_size_is_checked_before_decoding(tmp_path, monkeypatch):
    from pycocotools import mask as coco_mask

    gt, answers = _make_dataset(tmp_path / "ds")
    pred, lineno = _with_line(tmp_path, gt, answers, "s1_positive_0", {"size": [40000, 40000], "counts": "0"})
    monkeypatch.setattr(coco_mask, "decode", lambda *_a: pytest.fail("decoded before the size check"))
    with pytest.raises(MaskShapeError, match=rf"line {lineno}: prediction mask of pair s1_positive_0.*40000"):
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)


@pytest.mark.parametrize("counts, reason", [
    (None, "sum to 300, expected 600"),  # a valid RLE of the top half only
    ([-5, 605], "negative run length"),
    ("0é1", "not ASCII"),
    ([1.5, 598.5], "must be integers"),
    ("!!", "outside"),
])
def test_inconsistent_rle_is_an_error_naming_the_line(tmp_path, counts, reason):
    from cxrground.errors import MaskError

    gt, answers = _make_dataset(tmp_path / "ds")
    if counts is None:
        half = encode_rle(np.ones((10, 30), bool))
        rle = {"size": list(SHAPE), "counts": half["counts"]}
    else:
        rle = {"size": list(SHAPE), "counts": counts}
    pred, lineno = _with_line(tmp_path, gt, answers, "s1_positive_1", rle)
    with pytest.raises(MaskError, match=rf"line {lineno}: prediction mask of pair s1_positive_1: .*{reason}") as info:
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)
    assert info.value.path == str(pred)


def test_null_mask_on_a_negative_is_an_empty_prediction(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    pred, _ = _with_line(tmp_path, gt, answers, "s1_negative_0", None)
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=0)
    assert r["missing_mask"] == [] and r["segmentation"]["N-Acc"] == 1.0
    pred, _ = _with_line(tmp_path, gt, answers, "s1_positive_0", None)  # on a positive it stays missing
    assert evaluate_dataset(tmp_path / "ds", pred, n_boot=0)["missing_mask"] == ["s1_positive_0"]


def test_split_all_scores_every_split(tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main

    gt, answers = _make_dataset(tmp_path / "ds")
    data_file = tmp_path / "ds" / "mimic_ils_instruction_answer.json"
    data = json.loads(data_file.read_text())
    study = data["test"]["s1"]
    data["train"]["s1"] = study  # the same study in two splits: twice the pairs
    data_file.write_text(json.dumps(data))
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    r = evaluate_dataset(tmp_path / "ds", pred, split="all", n_boot=0)
    assert r["n_pairs"] == 2 * len(gt) and r["split"] == "all" and r["missing"] == []
    out = CliRunner().invoke(main, ["ils", "evaluate", "--dataset", str(tmp_path / "ds"), "--predictions", str(pred),
                                    "--split", "all", "--bootstrap", "0"])
    assert out.exit_code == 0, out.output
    assert f"evaluated {2 * len(gt)} pairs of split all" in out.output


def _with_instructions(pred, ds, change=()):
    """Add each pair's instruction to the lines of ``pred`` (another one for the pair ids in ``change``)."""
    pairs = {p["pair_id"]: p for study in json.loads((ds / "mimic_ils_instruction_answer.json").read_text())["test"]
             .values() for kind in ("positive_pairs", "negative_pairs")
             for p in study["instruction_answer_pairs"][kind]}
    lines = [json.loads(line) for line in pred.read_text().splitlines()]
    for line in lines:
        said = pairs[line["pair_id"]]["instruction"]
        line["instruction"] = "Segment the edema in the left upper zone lung." if line["pair_id"] in change else said
    pred.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_evaluate_refuses_predictions_whose_record_names_another_dataset(tmp_path):
    from cxrground.errors import InputError
    from cxrground.io.files import sha256_file

    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    _with_instructions(pred, tmp_path / "ds", change=("s1_negative_1",))
    side = tmp_path / "preds.jsonl.checkpoint.json"
    side.write_text(json.dumps({"dataset": "other/mimic_ils_instruction_answer.json", "dataset_sha256": "ab" * 32}))
    with pytest.raises(InputError) as refused:
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)
    msg = str(refused.value)
    assert str(pred) in msg and "another dataset (other/mimic_ils_instruction_answer.json, sha256 abababababab" in msg
    assert str(tmp_path / "ds" / "mimic_ils_instruction_answer.json") in msg
    assert "1 of its 7 predictions for pairs of split test" in msg and "e.g. s1_negative_1" in msg
    # the record names this dataset: scored (the record vouches for the pairs)
    side.write_text(json.dumps({"dataset_sha256": sha256_file(tmp_path / "ds" / "mimic_ils_instruction_answer.json")}))
    assert evaluate_dataset(tmp_path / "ds", pred, n_boot=0)["n_pairs"] == 7
    # a record naming another dataset refuses even lines without instructions
    _write_preds(pred, gt, answers)
    side.write_text(json.dumps({"dataset": "other.json", "dataset_sha256": "cd" * 32}))
    with pytest.raises(InputError, match="its 7 predictions for pairs of split test share this dataset's pair ids"):
        evaluate_dataset(tmp_path / "ds", pred, n_boot=0)


def test_evaluate_refuses_hand_made_predictions_for_other_instructions(tmp_path):
    from cxrground.cli import main

    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)
    _with_instructions(pred, tmp_path / "ds", change=("s1_positive_1", "s1_negative_0"))
    out = CliRunner().invoke(main, ["ils", "evaluate", "--dataset", str(tmp_path / "ds"), "--predictions", str(pred),
                                    "--bootstrap", "0", "--out", str(tmp_path / "r.json")])
    assert out.exit_code == 1 and "Traceback" not in out.output and not (tmp_path / "r.json").exists()
    assert "holds predictions of another dataset than" in out.output and str(pred) in out.output
    assert "2 of its 7 predictions" in out.output and "e.g. s1_positive_1" in out.output
    assert "checkpoint.json" not in out.output  # no record to remove


def test_evaluate_scores_hand_made_predictions_with_or_without_their_instructions(tmp_path):
    gt, answers = _make_dataset(tmp_path / "ds")
    pred = _write_preds(tmp_path / "preds.jsonl", gt, answers)  # no instruction field
    assert evaluate_dataset(tmp_path / "ds", pred, n_boot=0)["n_pairs"] == 7
    _with_instructions(pred, tmp_path / "ds")
    lines = [json.loads(line) for line in pred.read_text().splitlines()]
    lines[0]["instruction"] = "  " + lines[0]["instruction"].replace(" ", "  ") + "\n"  # spacing is not a difference
    del lines[1]["instruction"]  # a line without one is not compared
    pred.write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = evaluate_dataset(tmp_path / "ds", pred, n_boot=0)
    assert r["n_pairs"] == 7 and r["text"]["total"]["accuracy"] == 1.0
