"""The learned lesion segmenter: model files, recipe steps, heart/mediastinum exclusion, zone reading, the ILS
lesion-unet synthesizer and the image check of pairs (tiny arrays and a tiny randomly initialised U-Net)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cxrground.anatomy.ils_locations import ils_location_masks, lung_zone_bands
from cxrground.anatomy.segment.unet import UNetConfig, build_unet, save_model
from cxrground.errors import ConfigError
from cxrground.ils.compose import ComposedStudy, MaskOut
from cxrground.ils.image_check import DROPPED_NEGATIVE, DROPPED_POSITIVE, check_pairs, zones_of
from cxrground.ils.spatial import get_synthesizer
from cxrground.io.transform import Letterbox
from cxrground.lesions import segmenter_fit
from cxrground.lesions.lesion_zones import (
    LesionZoneReader,
    central_mask,
    lesion_field,
    mediastinum_mask,
    zone_scores,
)
from cxrground.lesions.segmenter import LesionSegmenter, load_lesion_segmenter, shipped_lesion_unet_path
from cxrground.lesions.segmenter_fit import (
    BaseFilm,
    LabelledFilm,
    LesionUNetRecipe,
    choose_threshold,
    film_score,
    film_scores,
    labelled_sample,
    simulated_sample,
    split_labelled,
    train_segmenter,
)
from masks_helpers import TOY_H, TOY_W, toy_lungs

H, W = TOY_H, TOY_W


def _film(seed: int = 0) -> np.ndarray:
    right, left = toy_lungs()
    img = np.full((H, W), 190.0)
    img[right | left] = 60.0
    img += np.random.default_rng(seed).normal(0, 2.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    config = UNetConfig(channels=(4, 8), out_channels=1, input_size=64, classes=("lesion",))
    path = tmp_path_factory.mktemp("w") / "tiny_lesion"
    save_model(build_unet(config), config, path, {"threshold": 0.4})
    return path.with_suffix(".safetensors")


def test_segmenter_gives_probabilities_at_native_size(tiny_weights):
    seg = LesionSegmenter(tiny_weights)
    p = seg.probability(_film())
    assert p.shape == (H, W) and p.dtype == np.float32 and 0.0 <= p.min() <= p.max() <= 1.0
    assert seg.threshold == 0.4 and seg.provenance()["sha256"]


def test_segmenter_refuses_lung_weights_and_missing_files(tmp_path):
    config = UNetConfig(channels=(4, 8), input_size=64)
    save_model(build_unet(config), config, tmp_path / "lungs")
    with pytest.raises(ConfigError, match="not a lesion segmenter"):
        LesionSegmenter(tmp_path / "lungs.safetensors")
    with pytest.raises(ConfigError, match="not found"):
        LesionSegmenter(tmp_path / "absent.safetensors")


def test_mediastinum_and_centre_exclude_the_middle_and_the_heart():
    right, left = toy_lungs()
    med = mediastinum_mask(right, left)
    assert med[62, 70] and not med[62, 38] and not (med & (right | left)).any()
    heart = np.zeros_like(right)
    heart[80:105, 50:100] = True
    centre = central_mask(right, left, heart)
    assert centre[90, 95] and centre[62, 70] and not centre[62, 20] and not centre[62, 120]
    bare = central_mask(right, left, heart, margin=0.0)
    assert np.array_equal(bare, mediastinum_mask(right, left) | heart) and centre.sum() > bare.sum()
    p = np.ones((H, W), np.float32)
    field = lesion_field(p, right, left, heart)
    assert field[90, 95] == 0 and field[62, 20] == 1 and field[5, 5] == 0


def test_zone_scores_find_the_zone_with_the_lesion_only():
    right, left = toy_lungs()
    p = np.zeros((H, W), np.float32)
    base = lung_zone_bands(right)["lung base"]
    p[base] = 0.9
    p[mediastinum_mask(right, left)] = 1.0  # never counted
    scores = zone_scores(p, right, left, None, 0.5)
    assert scores["C"] > 0.9 and all(scores[z] == 0 for z in "ABDEF")


def test_zone_reader_flags_by_zone_share(tiny_weights):
    reader = LesionZoneReader(LesionSegmenter(tiny_weights))
    right, left = toy_lungs()
    scores, flags, p = reader.read(_film(), right, left, None)
    assert set(scores) == set("ABCDEF") and p.shape == (H, W)
    assert all(flags[z] == (scores[z] >= reader.cover) for z in scores)
    assert reader.name().startswith("lesion-unet")


def _toy_canvas_films(n: int) -> list[BaseFilm]:
    right, left = toy_lungs()
    pad = np.zeros((128, 128), np.uint8)
    films = []
    for i in range(n):
        px = pad.copy()
        px[4:124, :] = _film(i)[:, 6:134]
        r, lft = np.zeros_like(pad, bool), np.zeros_like(pad, bool)
        r[4:124, :], lft[4:124, :] = right[:, 6:134], left[:, 6:134]
        films.append(BaseFilm(f"f{i}", f"p{i}", px, r, lft, np.ones_like(pad, bool)))
    return films


def test_simulated_sample_truth_and_a_short_training_run():
    films = _toy_canvas_films(3)
    recipe = LesionUNetRecipe(channels=(4, 8), size=128, steps=2, batch=2, val_copies=1)
    x, y = simulated_sample(films[0], recipe, seed=3)
    assert x.shape == y.shape == (128, 128) and y.dtype == bool
    x2, y2 = simulated_sample(films[0], recipe, seed=3)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)  # deterministic for the seed
    positive = [simulated_sample(films[0], dataclasses.replace(
        recipe, params=dataclasses.replace(recipe.params, p_negative=0.0)), seed=s, augment=False)[1] for s in range(3)]
    assert all(t.any() and not t[~(films[0].right | films[0].left)].mean() > 0.5 for t in positive)
    logs: list[str] = []
    model, config = train_segmenter(films[:2], recipe, logs.append)
    assert config.classes == ("lesion",) and logs and "step 2/2" in logs[-1]
    t, dice = choose_threshold(model, films[2:], recipe)
    assert t in recipe.thresholds and set(dice) == {str(v) for v in recipe.thresholds}


def test_film_score_pools_the_top_share_inside_the_region():
    import torch

    p = torch.zeros(2, 10, 10)
    p[0, 0, :4] = torch.tensor([0.9, 0.8, 0.1, 0.1])
    p[1, 9, 9] = 1.0  # outside the region: never counted
    region = torch.zeros(2, 10, 10, dtype=torch.bool)
    region[:, :5] = True
    score = film_score(p, region, top=0.04)  # 2 of 50 pixels
    assert torch.allclose(score, torch.tensor([0.85, 0.0]))
    assert film_score(p, torch.zeros_like(region), top=0.04).tolist() == [0.0, 0.0]


def test_labelled_films_split_by_patient_and_train_with_the_multiple_instance_loss(monkeypatch):
    films = _toy_canvas_films(6)
    labelled = [LabelledFilm(f, i % 2, f.right | f.left) for i, f in enumerate(films)]
    train, held = split_labelled(labelled, held=[films[0]], val_fold=4)
    assert labelled[0] in held and {f.film.patient for f in train}.isdisjoint({f.film.patient for f in held})
    assert len(train) + len(held) == 6
    x, region = labelled_sample(labelled[1], LesionUNetRecipe(size=128), seed=1)
    assert x.shape == region.shape == (128, 128) and region.any()
    base = LesionUNetRecipe(channels=(4, 8), size=128, steps=3, batch=1, val_copies=1, mil_batch=2)
    model, _ = train_segmenter(films[:2], base, lambda s: None)
    loss = segmenter_fit._mil_loss(model.train(), labelled, base, np.random.default_rng(0), step=0)
    loss.backward()  # the film labels reach the weights
    assert loss.item() > 0 and any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    calls = []
    real = segmenter_fit._mil_loss
    monkeypatch.setattr(segmenter_fit, "_mil_loss", lambda *a: calls.append(a[-1]) or real(*a))
    weak, _ = train_segmenter(films[:2], dataclasses.replace(base, mil_weight=1.0), lambda s: None, labelled)
    assert calls == [0, 1, 2]
    assert np.isfinite(film_scores(weak, labelled, base)).all()
    with pytest.raises(ConfigError, match="label 0"):
        train_segmenter(films[:2], dataclasses.replace(base, mil_weight=1.0, mil_batch=2), lambda s: None,
                        [lf for lf in labelled if lf.label == 1])


def test_lesion_unet_synthesizer_only_edits_lungs_outside_the_centre(tiny_weights):
    synth = get_synthesizer("lesion-unet", weights=str(tiny_weights), floor="0")
    right, left = toy_lungs()
    heart = np.zeros_like(right)
    heart[80:105, 50:100] = True
    x = _film()
    edit = right | left | heart
    x_hat = synth.synthesize(x, edit, regions=(right, left, heart))
    assert x_hat.shape == x.shape and (x_hat <= x).all()
    centre = central_mask(right, left, heart)
    assert np.array_equal(x_hat[~((right | left) & ~centre)], x[~((right | left) & ~centre)])
    assert (x_hat < x).any()  # floor 0: every lung pixel carries some anomaly
    ev = synth.evidence(x, (right, left, heart))
    assert ev is synth.evidence(x, (right, left, heart))  # cached for the same canvas
    assert synth.provenance()["model"]["threshold"] == 0.4
    with pytest.raises(ConfigError, match="lung masks"):
        synth.synthesize(x, edit)


def _pair(kind: str, target: str, location: list[str], mask_path: str | None = None) -> dict:
    if mask_path:
        return {"instruction": f"Segment the {target} in {location}.", "answer": "[SEG]", "type": kind,
                "target": target, "grounded_location": location, "seg_mask_path": mask_path, "pair_id": "x"}
    return {"instruction": f"Is there {target} in {location}?", "answer": "No.", "type": kind, "target": target,
            "location": location, "seg": False, "seg_mask_path": None, "pair_id": "x"}


def test_image_check_drops_contradicted_negatives_and_misplaced_positives():
    right, left = toy_lungs()
    locations = ils_location_masks(right, left)
    box = Letterbox.fit((H, W), (H, W))
    p = np.zeros((H, W), np.float32)
    p[locations["right lung base"]] = 0.9
    centre = central_mask(right, left, None)
    on_base = locations["right lung base"]
    out = ComposedStudy(
        positive_pairs=[_pair("basic", "opacity", ["right lung base"], "m0"),
                        _pair("basic", "opacity", ["left upper zone lung"], "m0")],
        negative_pairs=[_pair("basic", "opacity", ["right lung"]), _pair("basic", "effusion", ["left lung base"]),
                        _pair("global", "opacity", ["lung"]), _pair("global", "cardiomegaly", ["heart"]),
                        _pair("basic", "consolidation", ["right lung base"])],
        masks=[MaskOut("m0", "opacity", on_base)])
    check_pairs("s", out, locations, box, p, 0.5, centre)
    assert [q["grounded_location"] for q in out.positive_pairs] == [["right lung base"]]
    assert [(q["target"], q["location"]) for q in out.negative_pairs] == [("effusion", ["left lung base"]),
                                                                         ("cardiomegaly", ["heart"])]
    assert out.dropped == {DROPPED_NEGATIVE: 3, DROPPED_POSITIVE: 1}
    assert [q["pair_id"] for q in out.negative_pairs] == ["s_negative_0", "s_negative_1"]
    assert zones_of("lung") == [f"{s} {b}" for s in ("right", "left")
                                for b in ("upper zone lung", "mid zone lung", "lung base")]


@pytest.mark.skipif(not shipped_lesion_unet_path().is_file(), reason="lesion_unet_v1 not built")
def test_shipped_weights_load_with_their_sidecar():
    seg = load_lesion_segmenter()
    assert seg.meta["name"] == "lesion_unet_v1" and 0 < seg.threshold < 1
    assert seg.meta["training_films"] and "NIH" in seg.meta["licence"]
    assert shipped_lesion_unet_path().stat().st_size < 5_000_000


def test_ils_build_with_the_lesion_unet_synthesizer_checks_pairs(tiny_weights, tmp_path):
    from cxrground.datasets.synthetic import SynthConfig, write_cohort
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks

    cohort = tmp_path / "cohort"
    write_cohort(cohort, 4, seed=7, config=SynthConfig(width=256), progress=False)
    tasks, failures = build_tasks(cohort / "files")
    spec = BackendSpec(synthesizer="lesion-unet", synthesizer_kwargs={"weights": str(tiny_weights), "floor": "0"})
    out = tmp_path / "ils"
    summary = build_dataset(tasks, out, IlsConfig(seed=0), spec, scan_failures=failures, progress=False)
    assert summary.failures == 0 and summary.studies_in_dataset > 0
    card = (out / "card.md").read_text()
    assert "## Pairs left out by checks, by reason" in card
    import json

    prov = json.loads((out / "provenance.json").read_text())
    assert prov["backends"]["synthesizer"]["name"] == "lesion-unet"
    # floor 0 and a random model: the segmenter "finds" lesions in many zones, so negatives get dropped
    units = [json.loads(p.read_text()) for p in (out / "units").glob("*.json")]
    assert sum(sum(u.get("dropped_pairs", {}).values()) for u in units) > 0


def test_mediastinum_does_not_span_the_chest_where_a_lung_ends_laterally():
    right, left = toy_lungs()
    right[100:110, 30:] = False  # the right lung's base row ends laterally (a costophrenic angle only)
    right[100:110, 12:30] = True
    med = mediastinum_mask(right, left)
    assert not med[105, 40] and med[105, 70]


@pytest.mark.skipif(not shipped_lesion_unet_path().is_file(), reason="lesion_unet_v1 not built")
def test_anatomy_zones_resolves_the_lesion_reader_by_name():
    from cxrground.lesions.normative import NormativeModel
    from cxrground.lesions.zones import reader_name, resolve_zone_reader, zones_provenance

    reader = resolve_zone_reader("lesion-unet")
    assert isinstance(reader, LesionZoneReader) and reader_name(reader).startswith("lesion-unet lesion_unet_v1")
    prov = zones_provenance(NormativeModel.load(), reader, 1, 0)
    assert prov["zone_model"]["sha256"] == reader.segmenter.meta["sha256"] and prov["flag"] == "zone share >= 0.1"


def test_image_check_with_zone_reader_flags_drops_negatives_in_flagged_zones():
    from cxrground.ils.image_check import DROPPED_NEGATIVE_ZONES

    right, left = toy_lungs()
    locations = ils_location_masks(right, left)
    out = ComposedStudy(negative_pairs=[_pair("basic", "opacity", ["left lung"]),
                                        _pair("basic", "opacity", ["right upper zone lung"])])
    p = np.zeros((H, W), np.float32)
    flags = {z: z == "F" for z in "ABCDEF"}
    check_pairs("s", out, locations, Letterbox.fit((H, W), (H, W)), p, 0.5, central_mask(right, left, None), flags)
    assert [q["location"] for q in out.negative_pairs] == [["right upper zone lung"]]
    assert out.dropped == {DROPPED_NEGATIVE_ZONES: 1}
    with pytest.raises(ConfigError, match="zone_reader"):
        get_synthesizer("lesion-unet", zone_reader="other")
