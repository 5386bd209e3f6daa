"""Every generation backend through its real library on a tiny random model of the real architecture, then a small
``ils build`` through it (issue 13, item 2).

- RadEdit: diffusers ``UNet2DConditionModel`` + ``AutoencoderKL`` + a BERT text encoder and tokenizer saved with
  ``save_pretrained`` in the documented layout (:func:`save_tiny_radedit`);
- HybridGNet: the released state-dict key layout loaded into our torch implementation; its graph convolution and
  its ``roi_align`` window are checked against direct transcriptions of torch_geometric's and torchvision's
  definitions;
- CXAS: the package's checkpoint layout (``{"model": {"module.…": …}}``) loaded into our torch implementation, and
  compared with the ``cxas`` package's own network where that package is installed;
- YOLO: an ultralytics model built from its model yaml with the VinDr-CXR class names, saved as a ``.pt``.

The tests marked ``yolo`` (ultralytics, torchvision, the cxas package) run in ``.venv-yolo`` (``make test``), whose
torch 2.14.1 pairs with PyPI's torchvision; the main environment's CPU torch 2.13.0 cannot load it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from cxrground.anatomy.segment import get_segmenter  # noqa: E402
from cxrground.anatomy.segment.adapters import CXASSegmenter, HybridGNetSegmenter  # noqa: E402
from cxrground.anatomy.segment.cxas_net import CXAS_LABEL_IDS, CXASUNet, tiny_cxas  # noqa: E402
from cxrground.anatomy.segment.hybridgnet_net import (  # noqa: E402
    ORGANS,
    ChebConv,
    HybridGNet,
    ring_adjacency,
    roi_window_mean,
    scaled_laplacian,
    tiny_hybridgnet,
    upsample_matrix,
)
from cxrground.cli import main  # noqa: E402
from cxrground.datasets.synthetic import SynthConfig, write_cohort  # noqa: E402
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.ils.build import DATASET_FILE  # noqa: E402
from cxrground.ils.spatial import KEPT_CLASSES, get_detector, get_synthesizer  # noqa: E402
from cxrground.ils.spatial.boxes import normalize_class_name, save_tiny_yolo  # noqa: E402
from cxrground.ils.spatial.radedit import RADEDIT_SUBFOLDERS, save_tiny_radedit  # noqa: E402
from cxrground.io.image import CXRImage  # noqa: E402


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cohort")
    write_cohort(out, 3, seed=11, config=SynthConfig(width=256), progress=False)
    return out


@pytest.fixture(scope="module")
def radedit_dir(tmp_path_factory) -> Path:
    pytest.importorskip("diffusers", reason="RadEdit needs diffusers (the gen extra)")
    return save_tiny_radedit(tmp_path_factory.mktemp("radedit"))


@pytest.fixture(scope="module")
def hybridgnet_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hybridgnet") / "bestMSE.pt"
    torch.save(tiny_hybridgnet(input_size=64).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def cxas_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cxas")
    state = {f"module.{k}": v for k, v in tiny_cxas().state_dict().items()}  # as saved from DataParallel
    torch.save({"model": state, "epoch": 7}, folder / "UNet_ResNet50_default.pth")
    return folder


def _image(seed: int = 0, shape: tuple[int, int] = (90, 110)) -> CXRImage:
    pixels = (np.random.default_rng(seed).random(shape) * 255).astype(np.uint8)
    return CXRImage(pixels=pixels, path="random.png")


def _build(cohort: Path, out: Path, *args: str) -> dict:
    res = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                    "--quiet", "--seed", "1", *args])
    assert res.exit_code == 0, res.output
    for name in (DATASET_FILE, "card.md", "provenance.json", "failures.jsonl"):
        assert (out / name).is_file(), name
    return json.loads((out / "provenance.json").read_text())


# --- RadEdit ---------------------------------------------------------------------------------------------------

def test_radedit_through_diffusers(radedit_dir):
    assert {p.name for p in radedit_dir.iterdir()} >= set(RADEDIT_SUBFOLDERS)
    assert (radedit_dir / "unet" / "config.json").is_file() and (radedit_dir / "vae" / "config.json").is_file()
    synth = get_synthesizer("radedit", model_dir=str(radedit_dir), steps="3", size="64", strength="0.8",
                            device="cpu")
    img = (np.random.default_rng(1).random((100, 90)) * 255).astype(np.uint8)
    edit = np.zeros(img.shape, bool)
    edit[20:80, 15:70] = True
    x_hat = synth.synthesize(img, edit)
    assert x_hat.shape == img.shape and x_hat.dtype == np.uint8
    assert np.array_equal(x_hat[~edit], img[~edit])  # x̂ = x outside the edit mask, exactly
    assert np.abs(x_hat[edit].astype(int) - img[edit]).mean() > 1  # the random model did edit inside
    again = get_synthesizer("radedit", model_dir=str(radedit_dir), steps=3, size=64, strength=0.8, device="cpu")
    assert np.array_equal(again.synthesize(img, edit), x_hat)  # same seed, same x̂
    other = get_synthesizer("radedit", model_dir=str(radedit_dir), steps=3, size=64, strength=0.8, seed=1)
    assert not np.array_equal(other.synthesize(img, edit), x_hat)
    bf16 = get_synthesizer("radedit", model_dir=str(radedit_dir), steps=3, size=64, strength=0.8,
                           dtype="bfloat16", device="cpu")
    editor = bf16._load()
    assert editor.unet.dtype == torch.bfloat16 and editor.vae.dtype == torch.bfloat16
    assert editor.text_encoder.dtype == torch.bfloat16 and editor.device.type == "cpu"
    assert bf16.synthesize(img, edit).shape == img.shape
    assert bf16.provenance()["settings"]["dtype"] == "bfloat16"
    with pytest.raises(ConfigError, match="dtype"):
        get_synthesizer("radedit", model_dir=str(radedit_dir), dtype="float8")
    with pytest.raises(ConfigError, match="integers"):
        get_synthesizer("radedit", model_dir=str(radedit_dir), steps="many")


# --- HybridGNet ----------------------------------------------------------------------------------------------

def test_hybridgnet_graph_matrices():
    a = ring_adjacency(ORGANS)
    assert a.shape == (120, 120) and (a.sum(1) == 2).all() and (a == a.T).all()
    assert a[0, 43] == 1 and a[43, 0] == 1 and a[43, 44] == 0  # rings close within an organ, never across
    u = upsample_matrix(ORGANS)
    assert u.shape == (120, 60) and np.allclose(u.sum(1), 1.0)
    assert u[2, 1] == 1.0 and u[3, 1] == 0.5 and u[3, 2] == 0.5 and u[43, 21] == 0.5 and u[43, 0] == 0.5
    assert np.allclose(scaled_laplacian(a).numpy(), -a / 2)  # degree 2 everywhere


def test_chebconv_is_the_chebyshev_polynomial_of_the_scaled_laplacian():
    torch.manual_seed(0)
    conv = ChebConv(3, 5, 4)
    with torch.no_grad():
        conv.bias.normal_()
    lap = scaled_laplacian(ring_adjacency((6, 5)))
    x = torch.randn(2, 11, 3)
    eye = torch.eye(11)
    polys = [eye, lap, 2 * lap @ lap - eye, 4 * lap @ lap @ lap - 3 * lap]  # T_0..T_3
    expected = sum(torch.matmul(p, x) @ lin.weight.T for p, lin in zip(polys, conv.lins, strict=True)) + conv.bias
    assert torch.allclose(conv(x, lap), expected, atol=1e-5)


def _roi_align_reference(feature: np.ndarray, cx: float, cy: float) -> np.ndarray:
    """torchvision's CPU roi_align for one 3x3 box, output 1x1, aligned, adaptive sampling (transcribed loops)."""
    c, h, w = feature.shape
    x1, y1, x2, y2 = np.float32(cx - 1.0), np.float32(cy - 1.0), np.float32(cx + 2.0), np.float32(cy + 2.0)
    sx, sy = x1 - np.float32(0.5), y1 - np.float32(0.5)
    rw, rh = (x2 - np.float32(0.5)) - sx, (y2 - np.float32(0.5)) - sy
    gx, gy = math.ceil(rw), math.ceil(rh)
    total = np.zeros(c)
    for iy in range(gy):
        y = sy + np.float32(iy + 0.5) * rh / np.float32(gy)
        for ix in range(gx):
            x = sx + np.float32(ix + 0.5) * rw / np.float32(gx)
            if y < -1.0 or y > h or x < -1.0 or x > w:
                continue
            yy, xx = max(float(y), 0.0), max(float(x), 0.0)
            yl, xl = int(yy), int(xx)
            if yl >= h - 1:
                yh = yl = h - 1
                yy = float(yl)
            else:
                yh = yl + 1
            if xl >= w - 1:
                xh = xl = w - 1
                xx = float(xl)
            else:
                xh = xl + 1
            ly, lx = yy - yl, xx - xl
            total += ((1 - ly) * (1 - lx) * feature[:, yl, xl] + (1 - ly) * lx * feature[:, yl, xh]
                      + ly * (1 - lx) * feature[:, yh, xl] + ly * lx * feature[:, yh, xh])
    return total / max(gx * gy, 1)


def test_roi_window_mean_matches_torchvision_roi_align():
    rng = np.random.default_rng(0)
    feature = rng.normal(size=(1, 4, 8, 8)).astype(np.float32)
    centres = np.array([[[3.3, 4.7], [0.1, 0.2], [7.9, 7.5], [-0.8, 3.0], [9.5, 2.0], [5.0, 5.0]]], np.float32)
    got = roi_window_mean(torch.from_numpy(feature), torch.from_numpy(centres))[0].numpy()
    for n, (cx, cy) in enumerate(centres[0]):
        assert np.allclose(got[n], _roi_align_reference(feature[0], float(cx), float(cy)), atol=1e-5), n


def test_hybridgnet_state_dict_layout_and_sizes():
    net = tiny_hybridgnet()
    keys = set(net.state_dict())
    for key in ("encoder.dconv_down1.block.0.weight", "encoder.dconv_down1.skip.1.bias", "encoder.fc_logvar.weight",
                "dec_lin.weight", "graphConv_up6.lins.2.weight", "graphConv_up6.bias",
                "SC_1.graphConv_pre.lins.0.weight", "SC_2.graphConv_pre.lins.0.weight", "graphConv_up1.lins.0.weight"):
        assert key in keys, key
    for absent in ("graphConv_up1.bias", "SC_1.graphConv_pre.bias", "encoder.dconv_down6.skip.0.weight"):
        assert absent not in keys, absent
    assert not any("running_mean" in k for k in keys)  # batch norm without running statistics, as released
    full = HybridGNet()  # the released sizes
    assert full.graphConv_up4.lins[0].weight.shape == (32, 16 + 128 + 2) and len(full.graphConv_up4.lins) == 6
    assert full.encoder.fc_mu.weight.shape == (64, 128 * 32 * 32) and full.dec_lin.weight.shape == (16 * 60, 64)
    assert HybridGNet.config_from_state_dict(full.state_dict()) == full.config
    assert HybridGNet.config_from_state_dict(net.state_dict()) == net.config


def test_hybridgnet_segmenter_from_the_released_state_dict_form(hybridgnet_file):
    seg = get_segmenter("hybridgnet", weights_path=str(hybridgnet_file), device="cpu")
    image = _image()
    pts, box = seg.predict_landmarks(image)
    assert pts.shape == (120, 2) and seg.input_size == 64 and box.canvas_hw == (64, 64)
    with torch.no_grad():
        direct = HybridGNet.from_state_dict(torch.load(hybridgnet_file))(
            torch.from_numpy(box.image_to_canvas(image.pixels).astype(np.float32) / 255.0)[None, None])
    assert np.allclose(pts, direct[0].numpy() * 64, atol=1e-4)  # normalised output scaled to the canvas
    masks = seg.segment(image)
    assert masks.shape == image.shape and masks.source == "hybridgnet"
    prov = seg.provenance()
    assert prov["checkpoint_kind"] == "state-dict" and prov["input_size"] == 64 and prov["weights_sha256"]
    bf16 = HybridGNetSegmenter(hybridgnet_file, dtype="bfloat16", device="cpu")
    assert next(bf16._ensure().parameters()).dtype == torch.bfloat16
    assert np.abs(bf16.predict_landmarks(image)[0] - pts).max() < 8  # bf16 rounding on a 64-px canvas
    with pytest.raises(ConfigError, match="dtype"):
        HybridGNetSegmenter(hybridgnet_file, dtype="int8")


def test_hybridgnet_rejects_another_state_dict(tmp_path):
    wrong = tiny_hybridgnet().state_dict()
    wrong["dec_lin.weight"] = wrong["dec_lin.weight"][:-4]
    path = tmp_path / "wrong.pt"
    torch.save(wrong, path)
    with pytest.raises(ConfigError, match="not of the CheXmask lungs"):
        HybridGNetSegmenter(path).segment(_image())


# --- CXAS ----------------------------------------------------------------------------------------------------

def test_cxas_segmenter_from_the_package_checkpoint_form(cxas_dir):
    seg = get_segmenter("cxas", weights_dir=str(cxas_dir), device="cpu")
    image = _image(3, (70, 95))
    masks = seg.segment(image)
    assert masks.shape == image.shape and masks.source == "cxas"
    net = tiny_cxas()
    expected = net.predict(torch.from_numpy(image.pixels))
    assert np.array_equal(masks.right_lung, expected[CXAS_LABEL_IDS["right lung"]].numpy())
    assert np.array_equal(masks.left_lung, expected[CXAS_LABEL_IDS["left lung"]].numpy() & ~masks.right_lung)
    prov = seg.provenance()
    assert prov["predictor"] == "network" and prov["ignored_checkpoint_keys"] == [] and prov["weights_sha256"]
    bf16 = CXASSegmenter(cxas_dir, dtype="bfloat16", device="cpu")
    assert bf16.segment(image).shape == image.shape


def test_cxas_errors_name_the_file(tmp_path, cxas_dir):
    with pytest.raises(ConfigError, match="CXAS weights not found"):
        CXASSegmenter(tmp_path)
    bad = tmp_path / "UNet_ResNet50_default.pth"
    torch.save({"model": {"encoder.weight": torch.zeros(2)}}, bad)
    with pytest.raises(ConfigError, match="not a CXAS U-Net checkpoint"):
        CXASSegmenter(tmp_path).segment(_image())
    bad.write_bytes(b"<html>quota exceeded</html>")  # what a blocked Google Drive download leaves
    with pytest.raises(ConfigError, match="not a readable torch checkpoint"):
        CXASSegmenter(tmp_path).segment(_image())


def _cxas_network_module() -> types.ModuleType:
    """``cxas.models.UNet.backbone_unet`` of the installed cxas package, without running the package's
    ``__init__`` files: those import its DICOM-SEG writer (pydicom_seg), which needs pydicom < 3, while cxrground
    needs pydicom 3. The network files themselves import only torch and torchvision."""
    spec = importlib.util.find_spec("cxas")
    assert spec is not None and spec.submodule_search_locations, "the cxas package is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    shells = (("cxas", root), ("cxas.models", root / "models"), ("cxas.models.UNet", root / "models" / "UNet"))
    for name, folder in shells:
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [str(folder)]
            sys.modules[name] = shell
    return importlib.import_module("cxas.models.UNet.backbone_unet")


@pytest.mark.yolo
def test_cxas_network_matches_the_cxas_package():
    unet = _cxas_network_module()
    ref = unet.BackboneUNet("UNet_ResNet50_default", 159).eval()
    ours, ignored = CXASUNet.from_state_dict(ref.state_dict())
    assert ignored == [] and ours.config.blocks == (3, 4, 6, 3)
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref({"data": x})["logits"], atol=1e-4)


# --- YOLO ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def yolo_file(tmp_path_factory) -> Path:
    return save_tiny_yolo(tmp_path_factory.mktemp("yolo") / "vindr_tiny.pt")


@pytest.mark.yolo
def test_yolo_through_ultralytics(yolo_file):
    det = get_detector("yolo", weights_path=str(yolo_file), imgsz="64", predict_conf="0.001", device="cpu")
    canvas = (np.random.default_rng(0).random((96, 80)) * 255).astype(np.uint8)
    boxes = det.detect(canvas)
    kept = {normalize_class_name(k) for k in KEPT_CLASSES}
    assert all(b.label in kept and 0 <= b.x0 <= b.x1 < 80 and 0 <= b.y0 <= b.y1 < 96 for b in boxes)
    assert [b.confidence for b in boxes] == sorted((b.confidence for b in boxes), reverse=True)
    assert det._load().names[12] == "Pneumothorax" and det.provenance()["weights_sha256"]


@pytest.mark.yolo
def test_ils_build_with_yolo(cohort, yolo_file, tmp_path):
    prov = _build(cohort, tmp_path / "ils", "--segmenter", "masks", "--segmenter-opt", f"root={cohort / 'masks'}",
                  "--detector", "yolo", "--detector-opt", f"weights_path={yolo_file}", "--detector-opt", "imgsz=64")
    assert prov["backends"]["detector"]["name"] == "yolo"


# --- ils build through the real backends ----------------------------------------------------------------------

def test_ils_build_with_radedit_and_hybridgnet(cohort, radedit_dir, hybridgnet_file, tmp_path):
    out = tmp_path / "ils"
    prov = _build(cohort, out, "--synthesizer", "radedit", "--synthesizer-opt", f"model_dir={radedit_dir}",
                  "--synthesizer-opt", "steps=2", "--synthesizer-opt", "size=64",
                  "--segmenter", "hybridgnet", "--segmenter-opt", f"weights_path={hybridgnet_file}")
    backends = prov["backends"]
    assert backends["synthesizer"]["name"] == "radedit" and backends["synthesizer"]["settings"]["steps"] == 2
    assert backends["segmenter"]["backend"] == "hybridgnet"
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    data = json.loads((out / DATASET_FILE).read_text())
    assert len(data) + len({f.get("study_id") for f in failures}) >= 1  # every study ends in the data or a failure


def test_ils_build_with_radedit_on_true_masks_and_cxas_qc(cohort, radedit_dir, cxas_dir, tmp_path):
    out = tmp_path / "ils"
    prov = _build(cohort, out, "--synthesizer", "radedit", "--synthesizer-opt", f"model_dir={radedit_dir}",
                  "--synthesizer-opt", "steps=2", "--synthesizer-opt", "size=64",
                  "--segmenter", "masks", "--segmenter-opt", f"root={cohort / 'masks'}",
                  "--qc-segmenter", "cxas", "--qc-segmenter-opt", f"weights_dir={cxas_dir}")
    assert prov["backends"]["synthesizer"]["name"] == "radedit"
    assert json.dumps(prov).count("cxas") >= 1
    data = json.loads((out / DATASET_FILE).read_text())
    assert data  # true lung masks + the tiny RadEdit: a dataset with studies


# --- SAM deformer ---------------------------------------------------------------------------------------------

def test_sam_deformer_in_bfloat16(tmp_path):
    pytest.importorskip("transformers")
    from cxrground.percept.deform import get_deformer
    from cxrground.percept.deform.sam import save_tiny_sam

    deformer = get_deformer("sam", model_path=save_tiny_sam(tmp_path), device="cpu", dtype="bfloat16")
    shape = (60, 64)
    image = (np.random.default_rng(0).random(shape) * 255).astype(np.uint8)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    mask = (yy - 30) ** 2 + (xx - 30) ** 2 <= 14**2
    res = deformer.deform(image, mask, np.ones(shape, bool), np.ones(shape, bool), [(50, 30)], [(22, 30)],
                          np.random.default_rng(0))
    assert deformer._model.dtype == torch.bfloat16
    assert res.mask.shape == shape and res.logits.dtype == np.float32 and res.logits.shape == (32, 32)


# --- offline loading: no Hub kernels ----------------------------------------------------------------------------

def test_models_load_without_the_kernels_package(radedit_dir, tmp_path, monkeypatch):
    """transformers >= 4.54 loads Hub kernels by default and, on a machine without the ``kernels`` package,
    refuses the model ("Kernels are not available": RadEdit on an H200). Our loaders switch them off."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    from cxrground.hf_offline import KERNELS_SINCE, model_kwargs
    from cxrground.percept.deform.sam import SamDeformer, save_tiny_sam

    if Version(transformers.__version__) < Version(KERNELS_SINCE):
        assert "use_kernels" not in model_kwargs()
        pytest.skip("this transformers has no Hub kernels")
    import transformers.modeling_utils as mu

    monkeypatch.setattr(mu, "is_kernels_available", lambda: False)
    with pytest.raises(ValueError, match="Kernels are not available"):
        transformers.AutoModel.from_pretrained(radedit_dir / "text_encoder", local_files_only=True)
    editor = get_synthesizer("radedit", model_dir=str(radedit_dir), steps=2, size=64, device="cpu")._load()
    assert not editor.text_encoder.use_kernels
    deformer = SamDeformer(model_path=save_tiny_sam(tmp_path), device="cpu")
    deformer._load()
    assert not deformer._model.use_kernels


@pytest.mark.parametrize(("preset", "expected"), [(None, "1"), ("0", "0")])
def test_the_command_line_keeps_the_hub_offline(preset, expected):
    import os
    import subprocess
    import sys

    pytest.importorskip("huggingface_hub")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if preset is not None:
        env["HF_HUB_OFFLINE"] = preset
    code = ("import os, cxrground.cli, huggingface_hub.constants as c; "
            "print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [expected, str(expected == "1")]
