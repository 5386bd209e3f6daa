"""ILS §8 spatial step: pseudo-normal image, anomaly map, box detectors and the model adapters' error paths."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from cxrground.errors import ConfigError, MaskShapeError
from cxrground.ils.spatial import (
    AnomalyBoxDetector,
    Box,
    PseudoNormalSynthesizer,
    RadEditSynthesizer,
    YOLOBoxDetector,
    anomaly_map,
    anomaly_mask,
    boxes_from_yolo_result,
    get_detector,
    get_synthesizer,
    normalize_class_name,
)
from cxrground.ils.spatial.boxes import KEPT_CLASSES, box_matches_lesion, ellipse_kernel
from cxrground.ils.spatial.pseudo_normal import split_edit_mask
from cxrground.ils.spatial.radedit import RADEDIT_SUBFOLDERS
from cxrground.vocab.ils_templates import RADEDIT_PROMPT


def _phantom(blob: bool = True) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """A smooth lung-like region with thin bright 'ribs' and optionally one bright blob."""
    h, w = 160, 160
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    region = ((yy - 80) / 65) ** 2 + ((xx - 80) / 55) ** 2 <= 1.0
    img = 120.0 + 40.0 * (xx / w) + 20.0 * (yy / h) ** 2  # smooth background outside and inside
    img[region] = 60.0 + 0.15 * xx[region] + 0.1 * yy[region]
    for r in range(30, 140, 18):  # 3-px ribs, 10 grey levels
        img[r : r + 3][region[r : r + 3]] += 10.0
    centre = (70, 95)
    if blob:
        img += 70.0 * np.exp(-(((yy - centre[0]) / 20) ** 2 + ((xx - centre[1]) / 20) ** 2)) * region
    return np.clip(np.round(img), 0, 255).astype(np.uint8), region, centre


# --- anomaly map -------------------------------------------------------------------------------------

def test_anomaly_map_sign_and_outside_edit_mask():
    x = np.array([[100, 100, 100]], dtype=np.uint8)
    x_hat = np.array([[90, 100, 125]], dtype=np.uint8)
    a = anomaly_map(x, x_hat)
    assert a.dtype == np.float32
    assert a[0, 0] == pytest.approx(10 / 255) and a[0, 1] == 0 and a[0, 2] == pytest.approx(-25 / 255)
    assert (a > 0).tolist() == [[True, False, False]]  # only brighter-than-normal pixels are positive
    edit = np.array([[False, True, True]])
    a2 = anomaly_map(x, x_hat, edit)
    assert a2[0, 0] == 0.0 and a2[0, 2] == pytest.approx(-25 / 255)
    with pytest.raises(MaskShapeError):
        anomaly_map(x, np.zeros((2, 3), np.uint8))


def test_anomaly_mask_is_inclusive():
    a = np.array([[0.0999, 0.1, 0.5, -0.3]], dtype=np.float32)
    assert anomaly_mask(a, 0.1).tolist() == [[False, True, True, False]]
    with pytest.raises(ValueError):
        anomaly_mask(np.zeros(3), 0.1)


# --- pseudo-normal -------------------------------------------------------------------------------------

def test_pseudo_normal_removes_a_bright_blob_and_keeps_ribs():
    img, region, (cy, cx) = _phantom()
    clean, _, _ = _phantom(blob=False)
    synth = PseudoNormalSynthesizer()
    x_hat = synth.synthesize(img, region)
    assert x_hat.dtype == np.uint8 and x_hat.shape == img.shape
    assert np.array_equal(x_hat[~region], img[~region])  # x̂ = x outside the edit mask
    assert (x_hat <= img).all()
    a = anomaly_map(img, x_hat, region)
    assert a[cy, cx] >= 0.2  # the blob is anomalous
    assert abs(int(x_hat[cy, cx]) - int(clean[cy, cx])) <= 12  # and removed from x̂ (70 grey levels, > 80 %)
    far = region & (np.hypot(*(np.mgrid[0:160, 0:160] - np.array([cy, cx])[:, None, None])) > 55)
    assert (a[far] < 0.1).mean() > 0.97  # ribs and smooth lung are not anomalies...
    rib_row = 30 + 18 * 5 + 1  # a rib far from the blob
    cols = np.flatnonzero(region[rib_row])[10:-10]
    assert (x_hat[rib_row, cols].astype(int) - x_hat[rib_row - 6, cols].astype(int)).mean() > 5  # ...and kept
    assert np.array_equal(x_hat, synth.synthesize(img, region))  # deterministic


def test_pseudo_normal_regions_and_provenance():
    img, region, _ = _phantom()
    left = region & (np.arange(160)[None, :] < 80)
    right = region & ~left
    x_hat = PseudoNormalSynthesizer().synthesize(img, region, regions=(left, right))
    assert np.array_equal(x_hat[~region], img[~region])
    prov = PseudoNormalSynthesizer().provenance()
    assert prov["name"] == "pseudo-normal" and "structure_scale" in prov["settings"]
    with pytest.raises(MaskShapeError):
        PseudoNormalSynthesizer().synthesize(img, region[:-1])
    empty = np.zeros_like(region)
    assert np.array_equal(PseudoNormalSynthesizer().synthesize(img, empty), img)


def test_split_edit_mask_components_largest_first():
    m = np.zeros((10, 10), bool)
    m[0:2, 0:2] = True
    m[5:9, 5:9] = True
    parts = split_edit_mask(m)
    assert [int(p.sum()) for p in parts] == [16, 4]


# --- built-in detector -----------------------------------------------------------------------------------

def test_anomaly_box_detector_boxes_and_confidences():
    a = np.zeros((200, 200), np.float32)
    a[40:90, 30:80] = 0.35  # strong, large
    a[150:160, 150:162] = 0.12  # weak, small
    det = AnomalyBoxDetector(min_confidence=0.0)
    boxes = det.detect(np.zeros((200, 200), np.uint8), a)
    assert boxes and all(isinstance(b, Box) and 0.0 <= b.confidence <= 1.0 for b in boxes)
    assert boxes == sorted(boxes, key=lambda b: -b.confidence)
    top = boxes[0]
    assert (top.x0, top.y0, top.x1, top.y1) == (30, 40, 79, 89)
    weak = [b for b in boxes if b.y0 >= 140]
    assert weak and max(b.confidence for b in weak) < top.confidence
    assert det.detect(np.zeros((200, 200), np.uint8), np.zeros((200, 200), np.float32)) == []
    assert AnomalyBoxDetector().detect(np.zeros((200, 200), np.uint8), a) == [b for b in boxes if b.confidence >= 0.2]
    with pytest.raises(ConfigError):
        det.detect(np.zeros((200, 200), np.uint8), None)


def test_anomaly_box_detector_clusters_nearby_foci():
    a = np.zeros((200, 200), np.float32)
    a[50:70, 50:70] = 0.4
    a[50:70, 74:94] = 0.4  # 4 px apart: one cluster box around both
    boxes = AnomalyBoxDetector(min_confidence=0.0).detect(np.zeros((200, 200), np.uint8), a)
    spans = {(b.x0, b.x1) for b in boxes}
    assert (50, 69) in spans and (74, 93) in spans and (50, 93) in spans


def test_ellipse_kernel_shape():
    k = ellipse_kernel(5)
    assert k.shape == (5, 5) and k[2].all() and k[:, 2].all() and not k[0, 0]
    with pytest.raises(ValueError):
        ellipse_kernel(0)


# --- YOLO adapter ------------------------------------------------------------------------------------------

class _T:
    """A torch-like tensor: .cpu().numpy()."""

    def __init__(self, data):
        self.data = np.asarray(data)

    def cpu(self):
        return self

    def numpy(self):
        return self.data


VINDR = {0: "Aortic enlargement", 1: "Atelectasis", 2: "Calcification", 3: "Cardiomegaly", 4: "Consolidation",
         5: "ILD", 6: "Infiltration", 7: "Lung Opacity", 8: "Nodule/Mass", 9: "Other lesion",
         10: "Pleural effusion", 11: "Pleural thickening", 12: "Pneumothorax", 13: "Pulmonary fibrosis",
         14: "No finding"}


def _fake_result(classes, names=VINDR):
    n = len(classes)
    xyxy = [[10.2, 20.0, 30.7, 40.0]] * n
    conf = np.linspace(0.9, 0.1, n)
    return SimpleNamespace(boxes=SimpleNamespace(xyxy=_T(xyxy), conf=_T(conf), cls=_T(classes)), names=names)


def test_yolo_class_filter_keeps_the_ten_hyperintense_classes():
    boxes = boxes_from_yolo_result(_fake_result(list(range(15))), (64, 64))
    labels = [b.label for b in boxes]
    assert sorted(labels) == sorted(KEPT_CLASSES)
    for dropped in ("aortic enlargement", "other lesion", "pneumothorax", "cardiomegaly", "no finding"):
        assert dropped not in labels
    b = boxes[0]
    assert (b.x0, b.y0, b.x1, b.y1) == (10, 20, 30, 39)  # edge coordinates → inclusive pixels
    assert all(0 <= x.confidence <= 1 for x in boxes)


def test_yolo_class_name_normalisation_and_clipping():
    names = ["nodule_mass", "Lung-Opacity", "pleural  effusion", "other_lesion", "ild"]
    res = SimpleNamespace(boxes=SimpleNamespace(xyxy=_T([[-5, -5, 100, 100]] * 5), conf=_T([1.2] * 5),
                                                cls=_T([0, 1, 2, 3, 4])), names=names)
    boxes = boxes_from_yolo_result(res, (50, 60))
    assert {b.label for b in boxes} == {"nodule/mass", "lung opacity", "pleural effusion", "ILD"}
    assert all((b.x0, b.y0, b.x1, b.y1, b.confidence) == (0, 0, 59, 49, 1.0) for b in boxes)
    assert normalize_class_name(" Nodule / Mass ") == "nodule/mass"
    assert normalize_class_name("Pulmonary_Fibrosis") == "pulmonary fibrosis"
    assert box_matches_lesion("Pleural effusion", "effusion") and not box_matches_lesion("pleural effusion", "edema")
    assert box_matches_lesion("anomaly", "edema")  # unknown labels match every lesion


def test_yolo_adapter_errors_and_injected_model(tmp_path):
    with pytest.raises(ConfigError, match="weights not found"):
        YOLOBoxDetector(tmp_path / "missing.pt")
    weights = tmp_path / "vindr.pt"
    weights.write_bytes(b"not a real checkpoint")
    if importlib.util.find_spec("ultralytics") is None:
        with pytest.raises(ConfigError, match="pip install ultralytics"):
            YOLOBoxDetector(weights).detect(np.zeros((32, 32), np.uint8))
    calls = {}

    class FakeModel:
        names = VINDR

        def predict(self, image, **kwargs):
            calls.update(kwargs, shape=image.shape)
            return [_fake_result([12, 7])]

    det = YOLOBoxDetector(weights, imgsz=640, model=FakeModel())
    boxes = det.detect(np.zeros((64, 64), np.uint8))
    assert [b.label for b in boxes] == ["lung opacity"]
    assert calls["imgsz"] == 640 and calls["shape"] == (64, 64, 3)
    assert det.provenance()["weights_sha256"] is not None


# --- RadEdit adapter ----------------------------------------------------------------------------------------

def test_radedit_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="RadEdit weights not found"):
        RadEditSynthesizer(tmp_path / "nowhere")
    (tmp_path / "unet").mkdir()
    with pytest.raises(ConfigError, match="vae/"):
        RadEditSynthesizer(tmp_path)
    for sub in RADEDIT_SUBFOLDERS:
        (tmp_path / sub).mkdir(exist_ok=True)
    missing = [p for p in ("diffusers", "transformers", "torch") if importlib.util.find_spec(p) is None]
    if missing:
        with pytest.raises(ConfigError, match="pip install"):
            RadEditSynthesizer(tmp_path)
    with pytest.raises(ConfigError):
        RadEditSynthesizer(tmp_path, steps=0)
    with pytest.raises(ConfigError):
        RadEditSynthesizer(tmp_path, strength=1.5)


def test_radedit_argument_plumbing_with_an_injected_editor():
    seen = {}

    def editor(image, mask, **kwargs):
        seen.update(kwargs, shape=image.shape, mask_shape=mask.shape, mask_any=bool(mask.any()))
        return np.full(image.shape, 7, np.uint8)

    synth = RadEditSynthesizer("/nonexistent", steps=20, guidance=3.0, seed=5, strength=0.5, editor=editor)
    img = np.full((100, 80), 200, np.uint8)
    edit = np.zeros((100, 80), bool)
    edit[20:60, 10:50] = True
    x_hat = synth.synthesize(img, edit)
    assert seen == {"prompt": RADEDIT_PROMPT, "steps": 20, "guidance": 3.0, "seed": 5, "strength": 0.5,
                    "shape": (512, 512), "mask_shape": (512, 512), "mask_any": True}
    assert x_hat.shape == img.shape and x_hat.dtype == np.uint8
    assert (x_hat[~edit] == 200).all() and (x_hat[edit] == 7).all()
    assert synth.provenance()["settings"]["prompt"] == RADEDIT_PROMPT


# --- registry ---------------------------------------------------------------------------------------------

def test_backend_registry():
    assert isinstance(get_synthesizer("pseudo-normal"), PseudoNormalSynthesizer)
    assert isinstance(get_detector("anomaly", levels=(0.1,)), AnomalyBoxDetector)
    with pytest.raises(ConfigError, match="unknown synthesizer"):
        get_synthesizer("gan")
    with pytest.raises(ConfigError, match="does not accept option 'nonsense'"):
        get_detector("anomaly", nonsense=1)
    with pytest.raises(ConfigError):
        get_detector("yolo", weights_path="/no/such.pt")


def test_normative_synthesizer_takes_the_normal_median_by_default_and_sets_the_detector_strength():
    """Band 0 (default) removes more of a bright patch than band 2; the built-in detector gets strength_mid 0.14
    with the normative synthesizer only, and the user's detector options win."""
    from cxrground.ils.build import BackendSpec
    from cxrground.ils.pipeline import Backends
    from cxrground.ils.spatial import detector_defaults
    from cxrground.ils.spatial.normative import NormativeSynthesizer

    yy, xx = np.mgrid[0:128, 0:128]
    right = ((yy - 64) / 45) ** 2 + ((xx - 35) / 20) ** 2 <= 1
    left = ((yy - 64) / 45) ** 2 + ((xx - 93) / 20) ** 2 <= 1
    image = np.full((128, 128), 200, np.uint8)
    image[right | left] = 60
    patch = right & (yy > 80)
    image[patch] = 170
    lungs = right | left
    median = NormativeSynthesizer(model="shipped")
    assert median.band == 0.0
    x0 = median.synthesize(image, lungs, regions=(right, left))
    x2 = NormativeSynthesizer(model="shipped", band=2.0).synthesize(image, lungs, regions=(right, left))
    assert (x0[~lungs] == image[~lungs]).all() and (x0 <= x2).all()
    removed0, removed2 = (image[patch] - x0[patch].astype(int)).mean(), (image[patch] - x2[patch].astype(int)).mean()
    assert removed0 > removed2 > 0
    assert detector_defaults(median, "anomaly") == {"strength_mid": 0.14}
    assert detector_defaults(median, "yolo") == {} and detector_defaults(PseudoNormalSynthesizer(), "anomaly") == {}
    normative = Backends(BackendSpec(synthesizer="normative", synthesizer_kwargs={"model": "shipped"}))
    assert normative.detector.strength_mid == 0.14
    assert Backends(BackendSpec(synthesizer="pseudo-normal")).detector.strength_mid == 0.26
    pinned = Backends(BackendSpec(synthesizer="normative", synthesizer_kwargs={"model": "shipped"},
                                  detector_kwargs={"strength_mid": "0.3"}))
    assert pinned.detector.strength_mid == 0.3
