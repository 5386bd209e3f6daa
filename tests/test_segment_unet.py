"""The lung U-Net: architecture, model files, a tiny deterministic training run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from cxrground.anatomy.segment.unet import (  # noqa: E402
    UNetConfig,
    build_unet,
    count_parameters,
    load_model,
    predict_logits,
    prepare_input,
    save_model,
)
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.models.lung_unet import Augment, Samples, TrainRecipe, split_by_patient, train_on_samples  # noqa: E402

TINY = UNetConfig(channels=(4, 8, 16), input_size=32)


def _tiny_samples(n: int = 4, size: int = 32) -> Samples:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size]
    images, targets = [], []
    for k in range(n):
        r = (xx - 9 - k % 2) ** 2 + (yy - 16) ** 2 < 36 + 4 * k
        lft = (xx - 23) ** 2 + (yy - 16 + k % 2) ** 2 < 36 + 3 * k
        img = 0.7 - 0.4 * (r | lft) + rng.normal(0, 0.03, (size, size))
        images.append(np.clip(img, 0, 1).astype(np.float32))
        targets.append(np.stack([r, lft]).astype(np.float32))
    ones = np.ones((n, size, size), dtype=np.float32)
    return Samples(np.stack(images), np.stack(targets), ones, ones.astype(bool), [f"s{k}" for k in range(n)])


def test_forward_shape_on_tiny_config():
    model = build_unet(TINY)
    out = model(torch.zeros(2, 1, 32, 32))
    assert tuple(out.shape) == (2, 2, 32, 32)
    assert predict_logits(model, np.zeros((3, 32, 32), np.float32)).shape == (3, 2, 32, 32)


def test_default_config_size_is_in_range():
    n = count_parameters(build_unet(UNetConfig()))
    assert 500_000 <= n <= 2_000_000


def test_config_validation():
    with pytest.raises(ConfigError):
        UNetConfig(channels=(4, 8, 16), input_size=30)
    with pytest.raises(ConfigError):
        UNetConfig(out_channels=3)
    assert UNetConfig.from_dict(TINY.to_dict()) == TINY


def test_prepare_input_letterboxes_and_normalises():
    pixels = (np.arange(60 * 100) % 251).astype(np.uint8).reshape(60, 100)
    canvas, box = prepare_input(pixels, 64)
    assert canvas.shape == (64, 64) and canvas.dtype == np.float32
    valid = canvas[box.valid_region()]
    assert abs(float(valid.mean())) < 1e-3 and abs(float(valid.std()) - 1.0) < 1e-2
    assert (canvas[: box.offset_yx[0]] == 0).all()


def test_two_steps_decrease_the_loss_and_are_deterministic():
    samples = _tiny_samples()
    recipe = TrainRecipe(epochs=2, batch_size=4, lr=1e-2, warmup_epochs=0.0, threads=1,
                         augment=Augment(enabled=False))
    _, hist = train_on_samples(samples, None, TINY, recipe, seed=3, progress=False)
    assert len(hist) == 2 and hist[1]["loss"] < hist[0]["loss"]

    aug = TrainRecipe(epochs=2, batch_size=4, lr=1e-2, threads=1)
    m1, _ = train_on_samples(samples, samples, TINY, aug, seed=7, progress=False)
    m2, _ = train_on_samples(samples, samples, TINY, aug, seed=7, progress=False)
    m3, _ = train_on_samples(samples, None, TINY, aug, seed=8, progress=False)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)
    assert not torch.are_deterministic_algorithms_enabled()  # restored afterwards


def test_save_and_load_round_trip(tmp_path: Path):
    torch.manual_seed(0)
    model = build_unet(TINY).eval()
    wpath, jpath = save_model(model, TINY, tmp_path / "tiny", {"metrics": {"x": 1}})
    meta = json.loads(jpath.read_text())
    assert meta["format"] == "cxrground-unet/1" and meta["architecture"]["channels"] == [4, 8, 16]
    assert len(meta["sha256"]) == 64 and meta["storage_dtype"] == "float16"
    loaded, _ = load_model(wpath)
    x = torch.randn(1, 1, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), loaded(x), atol=5e-2)
    assert next(loaded.parameters()).dtype == torch.float32
    wpath.write_bytes(wpath.read_bytes()[:-1] + b"\0")
    with pytest.raises(ConfigError, match="sha256"):
        load_model(wpath)
    with pytest.raises(ConfigError, match="not found"):
        load_model(tmp_path / "missing.safetensors")


def test_in_memory_model_segments_at_native_size():
    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.io.image import CXRImage

    torch.manual_seed(0)
    model = build_unet(TINY).eval()
    seg = UNetLungSegmenter.from_model(model, {"input": {"size": 32}, "classes": list(TINY.classes)},
                                       estimate_heart=False)
    masks = seg.segment(CXRImage(np.full((48, 70), 100, dtype=np.uint8)))
    assert masks.shape == (48, 70) and masks.heart is None and masks.heart_source == "none"
    assert masks.extra["letterbox"]["canvas_hw"] == [32, 32]


class _Rec:
    def __init__(self, pid: str) -> None:
        self.patient_id = pid


def test_split_keeps_patients_together():
    recs = [_Rec(p) for p in "aabbbcdeeffg"]
    train, val = split_by_patient(recs, 3, seed=0)
    assert sorted(train + val) == list(range(len(recs))) and len(val) >= 3
    assert not {recs[i].patient_id for i in train} & {recs[i].patient_id for i in val}
    assert split_by_patient(recs, 3, seed=0) == (train, val)


def test_import_anatomy_does_not_import_torch():
    import subprocess

    code = ("import sys, cxrground.anatomy, cxrground.anatomy.segment, cxrground.models.lung_unet; "
            "print('torch' in sys.modules, 'safetensors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


class _FakeRecord:
    """A pack-like row: a 48 x 64 grey image with two dark lung fields."""

    def __init__(self, k: int, licence: str) -> None:
        self.image_id = f"img{k}"
        self.patient_id = f"p{k // 2}"
        self.license = licence
        self.source_url = "https://example.org"
        self.doi = ""
        self.k = k

    @property
    def shippable(self) -> bool:
        return self.license == "CC BY 4.0"

    def _masks(self):
        yy, xx = np.mgrid[:48, :64]
        r = ((xx - 18) / 11) ** 2 + ((yy - 24) / (16 + self.k % 3)) ** 2 <= 1
        lft = ((xx - 46) / 12) ** 2 + ((yy - 25) / 17) ** 2 <= 1
        return r, lft

    def read(self):
        from cxrground.io.image import CXRImage

        r, lft = self._masks()
        return CXRImage(np.where(r | lft, 60, 190).astype(np.uint8))

    def lungs(self, shape=None):
        return self._masks()

    def ignore(self, shape):
        return None


class _FakePack:
    def __init__(self) -> None:
        self.rows = [_FakeRecord(k, "CC BY 4.0") for k in range(6)] + [_FakeRecord(9, "CC BY-NC-SA")]

    def cohen(self, shippable_only: bool = False):
        return [r for r in self.rows if r.shippable or not shippable_only]


def test_train_lung_unet_writes_model_and_sidecar(tmp_path: Path):
    from cxrground.models.lung_unet import train_lung_unet

    recipe = TrainRecipe(batch_size=4, val_count=2, threads=1, synthetic_eval_count=0)
    res = train_lung_unet(_FakePack(), tmp_path, epochs=2, seed=0, recipe=recipe, config=TINY, name="tiny",
                          progress=False)
    assert res.weights_path.is_file() and res.sidecar_path.name == "tiny.json"
    meta = json.loads(res.sidecar_path.read_text())
    assert meta["data"]["train_licences"] == {"CC BY 4.0": 6}
    assert meta["data"]["evaluation"]["licences"] == {"CC BY-NC-SA": 1}
    names = {e["image"] for e in meta["data"]["train"] + meta["data"]["validation"]}
    assert "img9" not in names and len(meta["data"]["validation"]) >= 2
    assert meta["metrics"]["nc_eval"]["n"] == 1 and "dice_right_mean" in meta["metrics"]["nc_eval"]
    assert meta["training"]["epochs_run"] == 2 and meta["training"]["recipe"]["epochs"] == 2
    _, meta2 = load_model(res.weights_path)
    assert meta2["sha256"] == meta["sha256"]


def test_weights_trained_without_evaluation_are_evaluated_afterwards(tmp_path: Path):
    from cxrground.models.lung_unet import train_lung_unet
    from cxrground.models.lung_unet.train import evaluate_weights

    recipe = TrainRecipe(batch_size=4, val_count=2, threads=1, synthetic_eval_count=0)
    blind = train_lung_unet(_FakePack(), tmp_path / "blind", epochs=1, seed=0, recipe=recipe, config=TINY,
                            name="tiny", progress=False, evaluate=False)
    assert set(json.loads(blind.sidecar_path.read_text())["metrics"]) == {"val_canvas_dice_best", "best_epoch"}
    seen = train_lung_unet(_FakePack(), tmp_path / "seen", epochs=1, seed=0, recipe=recipe, config=TINY,
                           name="tiny", progress=False)
    metrics = evaluate_weights(_FakePack(), blind.weights_path, progress=False)
    meta = json.loads(blind.sidecar_path.read_text())
    assert meta["metrics"] == metrics and metrics["best_epoch"] == 1
    assert metrics["nc_eval"]["n"] == 1 and "img9" in metrics["nc_eval"]["per_image"]
    # the same validation films and the same numbers as an evaluation during training (same weights: CPU, seed 0)
    assert metrics["val_native"] == seen.metrics["val_native"]
    assert metrics["nc_eval"]["per_image"] == seen.metrics["nc_eval"]["per_image"]
    _, again = load_model(blind.weights_path)  # the weights' sha256 still matches the updated sidecar
    assert again["sha256"] == meta["sha256"]


def test_synthetic_samples_are_letterboxed_phantoms():
    from cxrground.datasets.synthetic import SynthConfig, generate_study
    from cxrground.models.lung_unet import concat_samples, synthetic_samples

    cfg = SynthConfig(width=128)
    s = synthetic_samples(2, 5, cfg, size=32)
    assert s.images.shape == (2, 32, 32) and s.targets.shape == (2, 2, 32, 32)
    assert s.ids == ["synth-5-0", "synth-5-1"] and (s.weights == 1).all()
    assert s.images.min() >= 0.0 and s.images.max() <= 1.0
    study = generate_study(5, 0, cfg)
    r, lft = study.anatomy_masks["right_lung"], study.anatomy_masks["left_lung"]
    # right lung on the image's left half, the letterboxed areas close to the native fractions
    assert s.targets[0, 0, :, :16].sum() > s.targets[0, 0, :, 16:].sum()
    assert abs(s.targets[0, 0].mean() / s.valid[0].mean() - r.mean()) < 0.03
    assert abs(s.targets[0, 1].mean() / s.valid[0].mean() - lft.mean()) < 0.03
    np.testing.assert_array_equal(synthetic_samples(2, 5, cfg, size=32).images, s.images)
    both = concat_samples(s, s.subset([1]))
    assert len(both) == 3 and both.ids[-1] == "synth-5-1"


def test_train_lung_unet_mixes_phantoms_and_fine_tunes(tmp_path: Path):
    from cxrground.datasets.synthetic import SynthConfig
    from cxrground.models.lung_unet import train_lung_unet

    cfg = SynthConfig(width=96)
    with pytest.raises(ConfigError, match="evaluation seed"):
        train_lung_unet(_FakePack(), tmp_path, epochs=1, recipe=TrainRecipe(synthetic_count=2, synthetic_seed=3,
                        synthetic_eval_seed=3), config=TINY, progress=False)
    first = train_lung_unet(_FakePack(), tmp_path / "a", epochs=1, recipe=TrainRecipe(batch_size=4, val_count=2,
                            threads=1, synthetic_eval_count=2), config=TINY, name="tiny", progress=False,
                            synth_config=cfg)
    recipe = TrainRecipe(batch_size=4, val_count=2, threads=1, synthetic_count=3, synthetic_seed=7,
                         synthetic_eval_seed=8, synthetic_eval_count=2, init_weights=str(first.weights_path))
    res = train_lung_unet(_FakePack(), tmp_path / "b", epochs=1, recipe=recipe, config=TINY, name="tiny",
                          progress=False, synth_config=cfg)
    meta = json.loads(res.sidecar_path.read_text())
    assert meta["data"]["synthetic_train"]["seed"] == 7 and meta["data"]["synthetic_train"]["count"] == 3
    assert meta["data"]["synthetic_eval"]["seed"] == 8
    assert meta["training"]["init"]["sha256"] == first.sidecar["sha256"]
    assert meta["metrics"]["synthetic_eval"]["n"] == 2 and "dice_left_mean" in meta["metrics"]["synthetic_eval"]
    assert meta["data"]["train_licences"] == {"CC BY 4.0": 6}  # phantoms are listed apart from the pack rows
    again = train_lung_unet(_FakePack(), tmp_path / "c", epochs=1, recipe=recipe, config=TINY, name="tiny",
                            progress=False, synth_config=cfg, evaluate=False)
    assert again.sidecar["sha256"] == meta["sha256"]  # same seed, same data, same init: identical weights


def _pack_like_samples(n: int = 3, size: int = 96) -> Samples:
    """Letterbox-like samples with two lung ellipses on a soft-tissue background (dark lungs)."""
    yy, xx = np.mgrid[:size, :size]
    images, targets = [], []
    for k in range(n):
        r = ((xx - 30) / 16) ** 2 + ((yy - 48) / (30 - k)) ** 2 <= 1
        lft = ((xx - 66) / 16) ** 2 + ((yy - 48) / 30) ** 2 <= 1
        images.append(np.where(r | lft, 0.25, 0.75).astype(np.float32))
        targets.append(np.stack([r, lft]).astype(np.float32))
    valid = np.ones((n, size, size), dtype=bool)
    valid[:, :4] = False  # a padded strip stays 0
    imgs = np.stack(images) * valid
    return Samples(imgs, np.stack(targets), np.ones((n, size, size), np.float32), valid, [f"s{k}" for k in range(n)])


def test_lesioned_samples_whiten_the_lungs_and_keep_the_labels():
    from cxrground.models.lung_unet import lesioned_samples
    from cxrground.models.lung_unet.config import dense_bases_params

    s = _pack_like_samples()
    out = lesioned_samples(s, 2, seed=3, params=dense_bases_params())
    assert len(out) == 6 and out.ids[:2] == ["s0#lesion0", "s0#lesion1"]
    np.testing.assert_array_equal(out.targets, s.targets[[0, 0, 1, 1, 2, 2]])  # the lung stays lung
    np.testing.assert_array_equal(out.valid, s.valid[[0, 0, 1, 1, 2, 2]])
    assert (out.images[:, :4] == 0).all() and out.images.max() <= 1.0
    lungs = out.targets.max(axis=1) > 0.5
    base = np.zeros_like(lungs)
    base[:, 60:] = True  # lower third of the ellipses
    gain = out.images - s.images[[0, 0, 1, 1, 2, 2]]
    # dense basal disease: the lung bases brighten on average by more than a fifth of the range
    assert gain[lungs & base].mean() > 0.2
    np.testing.assert_array_equal(lesioned_samples(s, 2, seed=3, params=dense_bases_params()).images, out.images)
    assert not np.array_equal(lesioned_samples(s, 2, seed=4, params=dense_bases_params()).images, out.images)


def test_train_lung_unet_records_the_lesion_augmentation(tmp_path: Path):
    from cxrground.models.lung_unet import train_lung_unet
    from cxrground.models.lung_unet.config import DENSE_BASES, LungTrainRequest

    recipe = TrainRecipe(batch_size=4, val_count=2, threads=1, synthetic_eval_count=0, lesion_copies=1, lesion_seed=5)
    res = train_lung_unet(_FakePack(), tmp_path, epochs=1, recipe=recipe, config=TINY, name="tiny", progress=False,
                          evaluate=False)
    meta = json.loads(res.sidecar_path.read_text())
    aug = meta["data"]["lesion_augment"]
    assert aug["copies"] == 1 and aug["seed"] == 5 and aug["params"]["lower_bias"] == DENSE_BASES["lower_bias"]
    assert meta["training"]["recipe"]["lesion_copies"] == 1
    assert "lesioned copies" in meta["data"]["summary"]
    req = LungTrainRequest(out=tmp_path, lesion_copies=2, lesion_seed=1, max_minutes=3.0)
    assert (req.recipe().lesion_copies, req.recipe().lesion_seed, req.recipe().max_minutes) == (2, 1, 3.0)


def _striped_film(n: int = 3, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Films with rib-like stripes everywhere; the lower half is bright (a dense base), a 4-px padding band."""
    yy, xx = np.mgrid[:size, :size]
    stripes = 0.08 * np.sin(2 * np.pi * yy / 8.0)
    base = np.where(yy >= size // 2, 0.75, 0.25)
    img = np.clip(base + stripes + 0.01 * (xx / size), 0, 1)
    val = np.ones((size, size), dtype=np.float32)
    val[:4] = 0
    img = img * val
    return (torch.from_numpy(np.repeat(img[None, None], n, 0).astype(np.float32)),
            torch.from_numpy(np.repeat(val[None, None], n, 0)))


def test_texture_augment_is_seeded_keeps_padding_and_flattens_a_dense_base():
    from cxrground.models.lung_unet.loop import texture_augment

    img, val = _striped_film()
    aug = Augment(texture_p=1.0, unsharp_amount=(4.0, 4.0), local_mix=(1.0, 1.0))
    out = texture_augment(img, val, aug, torch.Generator().manual_seed(7))
    again = texture_augment(img, val, aug, torch.Generator().manual_seed(7))
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    other = texture_augment(img, val, Augment(texture_p=1.0), torch.Generator().manual_seed(8))
    assert not torch.equal(out, other)
    assert out.shape == img.shape and float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert float((out * (1 - val)).abs().max()) == 0.0  # the padding stays 0
    x = out[0, 0].numpy()
    top, bottom = x[8:28], x[36:60]  # away from the step between the halves
    stripe_amp = np.std(x[36:60, 32]), np.std(img[0, 0, 36:60, 32].numpy())
    # the bright base is no longer brighter by many stripe amplitudes; the stripes survive
    before = (img[0, 0, 36:60].mean() - img[0, 0, 8:28].mean()) / stripe_amp[1]
    after = (bottom.mean() - top.mean()) / stripe_amp[0]
    assert before > 5 and abs(after) < 0.5 * before
    assert stripe_amp[0] > 0.05
    # texture_p = 0 leaves every film as it is (the batch augmentation does not even call it then)
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(texture_augment(img, val, Augment(texture_p=0.0), gen), img.clamp(0, 1))


def test_augment_batch_with_texture_keeps_the_geometry_of_the_masks():
    from cxrground.models.lung_unet.loop import _augment_batch

    img, val = _striped_film(n=4)
    tgt = torch.zeros(4, 2, 64, 64)
    tgt[:, 0, 20:50, 8:28], tgt[:, 1, 20:50, 36:56] = 1.0, 1.0
    wgt = torch.ones(4, 1, 64, 64)
    plain = _augment_batch(img, tgt, wgt, val, Augment(), torch.Generator().manual_seed(3))
    tex = _augment_batch(img, tgt, wgt, val, Augment(texture_p=1.0), torch.Generator().manual_seed(3))
    for a, b in zip(plain[1:], tex[1:], strict=True):  # targets, weights, valid: the same affine
        assert torch.equal(a, b)
    assert not torch.equal(plain[0], tex[0])
    again = _augment_batch(img, tgt, wgt, val, Augment(texture_p=1.0), torch.Generator().manual_seed(3))
    assert torch.equal(again[0], tex[0])


def test_train_request_texture_option_reaches_the_recipe_and_sidecar(tmp_path: Path):
    from cxrground.models.lung_unet import train_lung_unet
    from cxrground.models.lung_unet.config import LungTrainRequest

    req = LungTrainRequest(out=tmp_path, texture_p=0.5)
    assert req.recipe().augment.texture_p == 0.5 and req.recipe().augment.gamma == Augment().gamma
    assert LungTrainRequest(out=tmp_path).recipe().augment == Augment()
    recipe = TrainRecipe(batch_size=4, val_count=2, threads=1, synthetic_eval_count=0,
                         augment=Augment(texture_p=1.0))
    res = train_lung_unet(_FakePack(), tmp_path, epochs=1, recipe=recipe, config=TINY, name="tiny", progress=False,
                          evaluate=False)
    meta = json.loads(res.sidecar_path.read_text())
    assert meta["training"]["recipe"]["augment"]["texture_p"] == 1.0
    assert meta["training"]["recipe"]["augment"]["unsharp_amount"] == [0.5, 4.0]


def test_train_device_option_is_checked_and_recorded(tmp_path: Path):
    from cxrground.errors import ConfigError
    from cxrground.models.lung_unet.config import LungTrainRequest

    assert LungTrainRequest(out=tmp_path, device="cuda:1").recipe().device == "cuda:1"
    assert LungTrainRequest(out=tmp_path).recipe().device == "cpu"
    with pytest.raises(ConfigError, match="device must be cpu or a CUDA device"):
        TrainRecipe(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            train_on_samples(_tiny_samples(), None, TINY, TrainRecipe(epochs=1, device="cuda"), progress=False)


def test_undecodable_weights_with_a_matching_sidecar_are_a_named_error(tmp_path):
    from cxrground.anatomy.segment.unet import UNetConfig, build_unet, load_model, save_model
    from cxrground.io.files import sha256_file

    config = UNetConfig(channels=(4, 8), input_size=32)
    weights, sidecar = save_model(build_unet(config), config, tmp_path / "m")
    weights.write_bytes(b"\xff" * 64)  # no safetensors header at all, and the sidecar's sha256 matches it
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "sha256": sha256_file(weights)}))
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        load_model(weights)
