"""External backends: HybridGNet landmark decoding and checkpoint handling, CXAS, the registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxrground.anatomy.segment import SEGMENTERS, get_segmenter
from cxrground.anatomy.segment.adapters import (
    HYBRIDGNET_SLICES,
    CXASSegmenter,
    HybridGNetSegmenter,
    decode_landmarks,
    fill_polygon,
)
from cxrground.errors import ConfigError, InputError
from cxrground.io.image import CXRImage
from cxrground.io.transform import Letterbox

# (centre x, centre y, radius x, radius y) per structure, in native pixels of a 300 x 500 image
SHAPES = {"right_lung": (150, 140, 70, 110), "left_lung": (340, 140, 80, 115), "heart": (270, 200, 60, 45)}
SHAPE = (300, 500)


def _ellipse_points(cx: float, cy: float, rx: float, ry: float, n: int) -> np.ndarray:
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], axis=1)


def _landmarks() -> np.ndarray:
    parts = [_ellipse_points(*SHAPES[k], HYBRIDGNET_SLICES[k].stop - HYBRIDGNET_SLICES[k].start)
             for k in ("right_lung", "left_lung", "heart")]
    return np.concatenate(parts)


def test_fill_polygon_square():
    m = fill_polygon(np.array([[2, 3], [7, 3], [7, 9], [2, 9]]), (12, 12))
    assert m.sum() == 6 * 7 and m[3:10, 2:8].all()


def test_decode_native_landmarks():
    pts = _landmarks()
    assert pts.shape == (120, 2)
    right, left, heart = decode_landmarks(pts, SHAPE)
    for name, mask in (("right_lung", right), ("left_lung", left), ("heart", heart)):
        cx, cy, rx, ry = SHAPES[name]
        expected = np.pi * rx * ry
        area = mask.sum()
        if name == "left_lung":  # made exclusive of the right lung; these two do not overlap
            assert not (right & left).any()
        assert abs(area - expected) / expected < 0.03, name
        ys, xs = np.nonzero(mask)
        assert abs(xs.mean() - cx) < 1.5 and abs(ys.mean() - cy) < 1.5
    assert (heart & left).any()  # the heart shadow may overlap a lung
    assert np.nonzero(right)[1].mean() < np.nonzero(left)[1].mean()


def test_decode_canvas_landmarks_maps_back_to_native():
    box = Letterbox.fit(SHAPE, 1024)
    canvas_pts = box.points_to_canvas(_landmarks())
    native = decode_landmarks(_landmarks(), SHAPE)
    mapped = decode_landmarks(canvas_pts, SHAPE, box)
    for a, b in zip(native, mapped, strict=True):
        assert a.shape == SHAPE and b.shape == SHAPE
        iou = (a & b).sum() / (a | b).sum()
        assert iou > 0.99


def test_decode_rejects_bad_arrays():
    with pytest.raises(InputError, match="120"):
        decode_landmarks(np.zeros((100, 2)), SHAPE)
    bad = _landmarks()
    bad[3, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        decode_landmarks(bad, SHAPE)
    with pytest.raises(InputError, match="letterbox"):
        decode_landmarks(_landmarks(), SHAPE, Letterbox.fit((200, 200), 1024))


def _image() -> CXRImage:
    return CXRImage(np.full(SHAPE, 128, dtype=np.uint8))


def test_hybridgnet_with_an_injected_model():
    box = Letterbox.fit(SHAPE, 1024)
    normalised = box.points_to_canvas(_landmarks()) / 1024.0

    def fake_model(x):
        assert tuple(x.shape) == (1, 1, 1024, 1024) and float(x.max()) <= 1.0
        return (normalised[None].copy(), "extra output")

    seg = HybridGNetSegmenter(model=fake_model)
    masks = seg.segment(_image())
    assert masks.shape == SHAPE and masks.heart_source == "model" and masks.source == "hybridgnet"
    right, _, heart = decode_landmarks(_landmarks(), SHAPE)
    assert (masks.right_lung & right).sum() / (masks.right_lung | right).sum() > 0.99
    assert (masks.heart & heart).sum() / (masks.heart | heart).sum() > 0.99
    assert seg.provenance()["landmarks"]["heart"] == [94, 119]


def test_hybridgnet_missing_checkpoint(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        HybridGNetSegmenter(tmp_path / "hybridgnet.pt")
    with pytest.raises(ConfigError, match="weights_path"):
        HybridGNetSegmenter()


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_hybridgnet_checkpoint_forms(tmp_path: Path):
    torch = pytest.importorskip("torch")
    state = tmp_path / "state.pt"
    torch.save({"encoder.weight": torch.zeros(2)}, state)
    with pytest.raises(ConfigError, match="state dict"):
        HybridGNetSegmenter(state).segment(_image())

    box = Letterbox.fit(SHAPE, 1024)
    const = torch.tensor(box.points_to_canvas(_landmarks()), dtype=torch.float32)[None]

    class Fake(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("pts", const)

        def forward(self, x):
            return self.pts + 0.0 * x.mean()

    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(Fake()), str(scripted))
    masks = HybridGNetSegmenter(scripted).segment(_image())
    _, left, _ = decode_landmarks(_landmarks(), SHAPE)
    assert (masks.left_lung & left).sum() / (masks.left_lung | left).sum() > 0.99

    exported = tmp_path / "exported.pt2"
    torch.export.save(torch.export.export(Fake(), (torch.zeros(1, 1, 1024, 1024),)), str(exported))
    seg = HybridGNetSegmenter(exported)
    masks = seg.segment(_image())
    assert (masks.left_lung & left).sum() / (masks.left_lung | left).sum() > 0.99
    assert seg.provenance()["checkpoint_kind"] == "torch.export"

    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a readable"):
        HybridGNetSegmenter(junk).segment(_image())

    pickled = tmp_path / "pickled.pt"
    torch.save(torch.nn.Identity(), pickled)
    with pytest.raises(ConfigError, match="allow_pickle"):
        HybridGNetSegmenter(pickled).segment(_image())
    trusted = HybridGNetSegmenter(pickled, allow_pickle=True)
    assert isinstance(trusted._ensure(), torch.nn.Identity)
    assert trusted.provenance()["checkpoint_kind"] == "pickled-module"


def test_cxas_without_weights_names_what_to_download(tmp_path: Path):
    with pytest.raises(ConfigError, match="CXAS weights not found"):
        CXASSegmenter(tmp_path)
    with pytest.raises(ConfigError, match=r"UNet_ResNet50_default\.pth"):
        get_segmenter("cxas", weights_dir=tmp_path)
    with pytest.raises(ConfigError, match="weights_dir="):
        CXASSegmenter()


def test_cxas_with_an_injected_predictor():
    h, w = SHAPE
    right, left, heart = decode_landmarks(_landmarks(), SHAPE)

    def small(m: np.ndarray) -> np.ndarray:  # CXAS may answer at its own size
        return m[::2, ::2]

    seg = CXASSegmenter(predictor=lambda px: {"right lung": small(right), "left lung": small(left),
                                              "heart": small(heart), "spine": np.zeros((h // 2, w // 2), bool)})
    masks = seg.segment(_image())
    assert masks.shape == SHAPE and masks.heart_source == "model"
    assert (masks.right_lung & right).sum() / (masks.right_lung | right).sum() > 0.95
    bad = CXASSegmenter(predictor=lambda px: {"right lung": right, "left lung": left})
    with pytest.raises(InputError, match="heart"):
        bad.segment(_image())


def test_registry():
    assert {"unet", "given", "cxas", "hybridgnet"} <= set(SEGMENTERS)
    with pytest.raises(ConfigError, match="unknown segmenter"):
        get_segmenter("sam")
    with pytest.raises(ConfigError, match="does not accept option 'nonsense'"):
        get_segmenter("unet", nonsense=1)
    with pytest.raises(ConfigError, match="not found"):
        get_segmenter("hybridgnet", weights_path="/nonexistent/hybridgnet.pt")
    assert get_segmenter("unet").name == "unet"  # lazy: constructing loads nothing
