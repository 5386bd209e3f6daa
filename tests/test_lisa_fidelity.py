"""The LISA model against the reference (ROSALIA / LISA) on points where the two can be compared on the CPU:
mixed-precision training (float32 trainable weights and AdamW state beside bfloat16 frozen weights), mask losses
over each sample's un-padded region, the CLIP processor's shortest-side resize, SAM's ``ResizeLongestSide``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cxrground.models.lisa.checkpoint import WEIGHTS_FILE  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.infer import model_inputs  # noqa: E402
from cxrground.models.lisa.model import LisaForSegmentation, prepare_for_training, tiny_arch  # noqa: E402
from cxrground.models.lisa.preprocess import (  # noqa: E402
    CLIP_MEAN,
    CLIP_STD,
    SAM_MEAN,
    SAM_STD,
    clip_pixels,
    gt_mask_canvas,
    sam_frame,
    sam_pixels,
)
from cxrground.models.lisa.text import encode, seg_token_id, tiny_tokenizer  # noqa: E402
from cxrground.models.losses import dice_loss, sigmoid_bce  # noqa: E402
from ils_helpers import tiny_ils  # noqa: E402

POS = ("Segment the edema in the right lung.", "[SEG]")
NEG = ("Segment the edema.", "[SEG] There is no edema.")
#: Gradients below this are round-off noise (e.g. ~1e-13 on the mask decoder's attention projections): AdamW's
#: eps (1e-8) shrinks their step below float32's resolution of the weight, with or without master weights.
GRAD_FLOOR = 1e-9
TINY = {"tiny": "true", "batch_size": "4", "micro_batch_size": "2", "max_length": "512", "threads": "1",
        "dtype": "bfloat16", "warmup_steps": "0", "lr": "3e-5", "hist_eq_p": "0"}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _fresh(tok, seed: int = 0) -> LisaForSegmentation:
    torch.manual_seed(seed)
    return LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    yy, xx = np.mgrid[:h, :w]
    img = 60 + 100 * np.exp(-((yy - h / 2) ** 2 + (xx - w / 3) ** 2) / (0.05 * h * w))
    return (img + np.random.default_rng(seed).normal(0, 12, (h, w))).clip(0, 255).astype(np.uint8)


def _inputs(model, tok, cfg, grey: np.ndarray, mask: np.ndarray):
    """One positive and one negative pair on ``grey`` (the model's inputs, the canvas GT and the resized sizes)."""
    c, s, box = model_inputs(model, cfg, grey)
    max_text = cfg.max_length - model.n_image_tokens + 1
    enc = [encode(tok, *POS, max_text), encode(tok, *NEG, max_text)]
    gt = torch.tensor(np.stack([gt_mask_canvas(mask, box), gt_mask_canvas(None, box)]))
    return enc, torch.tensor(np.stack([c, c])), torch.tensor(np.stack([s, s])), gt, [box.resized_hw] * 2


# --- 1. mixed precision ---------------------------------------------------------------------------
def test_mixed_precision_setup_keeps_trainable_weights_float32_and_small_steps_move_them(tok):
    from cxrground.models.lisa.training import autocast, setup_precision

    cfg = LisaConfig.tiny_defaults(dtype="bfloat16")
    model = _fresh(tok)
    prepare_for_training(model, cfg.lora_r, cfg.lora_alpha, 0.0)
    amp = setup_precision(model, cfg, "cpu")
    assert amp == torch.bfloat16
    named = dict(model.named_parameters())
    trainable = {n: p for n, p in named.items() if p.requires_grad}
    assert trainable and all(p.dtype == torch.float32 for p in trainable.values())
    frozen = [p for p in named.values() if not p.requires_grad and p.is_floating_point()]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    grey = _image(40, 56)
    mask = np.zeros(grey.shape, bool)
    mask[10:26, 6:24] = True
    batch = _inputs(model, tok, cfg, grey, mask)
    model.train()
    with autocast("cpu", amp):
        loss = model(*batch)
    assert torch.isfinite(loss.total)
    loss.total.backward()
    params = list(trainable.values())
    assert all(p.grad.dtype == torch.float32 for p in params if p.grad is not None)
    before = [p.detach().clone() for p in params]
    optim = torch.optim.AdamW(params, lr=3e-5, betas=(0.9, 0.95), weight_decay=0.0)
    optim.step()
    assert all(v.dtype == torch.float32 for st in optim.state.values() for k, v in st.items() if k != "step")
    moved = total = 0
    for p, p0 in zip(params, before, strict=True):
        if p.grad is None:
            continue
        got = p.grad.abs() > GRAD_FLOOR
        moved += int((p.detach() != p0)[got].sum())
        total += int(got.sum())
    assert total > 10_000
    assert moved / total > 0.99  # bfloat16 weights keep only ~12 % of such updates (REPORT §2.2)


def test_float32_and_deepspeed_precision_is_one_dtype(tok):
    from cxrground.models.lisa.training import setup_precision

    model = _fresh(tok)
    prepare_for_training(model, 8, 16, 0.0)
    assert setup_precision(model, LisaConfig.tiny_defaults(), "cpu") is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # under DeepSpeed the engine keeps the float32 master copy: the whole model is cast
    assert setup_precision(model, LisaConfig.tiny_defaults(dtype="bfloat16"), "cpu", deepspeed=True) is None
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.fixture(scope="module")
def ils(tmp_path_factory) -> Path:
    """A 4-study cohort and its ILS dataset."""
    return tiny_ils(tmp_path_factory.mktemp("lisa-fidelity"), 4)


def _train(ils: Path, out: Path, **overrides):
    from cxrground.models.lisa.training import train

    return train(ils / "ils", out, images=ils / "cohort" / "files", seed=0, overrides={**TINY, **overrides},
                 progress=False, val_split=None, log=None)


def _state(out: Path) -> dict:
    from cxrground.models.lisa.training import RESUME_FILE

    return torch.load(out / RESUME_FILE, map_location="cpu", weights_only=False)


def test_bf16_training_keeps_float32_master_weights_and_resumes_an_older_bf16_state(ils, tmp_path):
    from safetensors import safe_open

    start = _state(_train(ils, tmp_path / "lr0", max_steps="1", lr="0"))  # lr 0: the initial weights
    out = _train(ils, tmp_path / "run", max_steps="1")
    state = _state(out)
    assert {v.dtype for v in state["trainable"].values()} == {torch.float32}
    moments = [v for st in state["optim"]["state"].values() for k, v in st.items() if k != "step"]
    assert moments and {v.dtype for v in moments} == {torch.float32}
    # one AdamW step at lr 3e-5 moves (nearly) every weight that got a gradient (exp_avg = 0.1 · gradient)
    moved = total = 0
    names = list(state["trainable"])  # the optimiser's parameter order (those without a gradient have no state)
    for i, st in state["optim"]["state"].items():
        got = st["exp_avg"].abs() > 0.1 * GRAD_FLOOR
        moved += int((state["trainable"][names[i]] != start["trainable"][names[i]])[got].sum())
        total += int(got.sum())
    assert total > 10_000 and moved / total > 0.99
    # the checkpoint folder keeps the training dtype, as before
    with safe_open(str(out / WEIGHTS_FILE), "pt") as fh:
        assert {str(fh.get_slice(k).get_dtype()) for k in fh.keys()} == {"BF16"}  # noqa: SIM118
    # a resume state written with bfloat16 trainable weights and AdamW moments (before mixed precision) loads
    from cxrground.models.lisa.training import RESUME_FILE

    old = dict(state, step=0)
    old["trainable"] = {k: v.to(torch.bfloat16) for k, v in state["trainable"].items()}
    old["optim"] = {**state["optim"], "state": {i: {k: v if k == "step" else v.to(torch.bfloat16)
                                                    for k, v in st.items()}
                                                for i, st in state["optim"]["state"].items()}}
    torch.save(old, out / RESUME_FILE)
    again = _train(ils, tmp_path / "run", max_steps="1")
    resumed = _state(again)
    assert resumed["step"] == 1
    assert {v.dtype for v in resumed["trainable"].values()} == {torch.float32}
    assert json.loads((again / "checkpoint.json").read_text())["step"] == 1


# --- 2. mask losses over the un-padded region -----------------------------------------------------
def test_mask_losses_over_the_valid_region_equal_the_losses_of_the_crops():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, 40, generator=gen) * 3
    targets = (torch.rand(3, 40, 40, generator=gen) > 0.6).float()
    sizes = [(25, 40), (40, 17), (12, 9)]
    valid = torch.zeros(3, 40, 40, dtype=torch.bool)
    for i, (h, w) in enumerate(sizes):
        targets[i, h:] = 0
        targets[i, :, w:] = 0
        logits[i, h:] = 20.0  # confident wrong "lesion" in the padding: must not count
        logits[i, :, w:] = 20.0
        valid[i, :h, :w] = True
    targets[2] = 0  # a negative: BCE only
    crops = [(logits[i, :h, :w][None], targets[i, :h, :w][None]) for i, (h, w) in enumerate(sizes)]
    bce = np.mean([sigmoid_bce(lg, tg).item() for lg, tg in crops])
    dice = np.mean([dice_loss(lg, tg).item() for lg, tg in crops[:2]])
    assert sigmoid_bce(logits, targets, valid).item() == pytest.approx(bce, rel=1e-5)
    assert dice_loss(logits, targets, valid).item() == pytest.approx(dice, rel=1e-5)
    assert sigmoid_bce(logits, targets).item() > 2 * bce  # the padding would dominate
    with pytest.raises(ValueError):
        sigmoid_bce(logits, targets, valid[:, :10])


def test_forward_mask_loss_covers_only_the_unpadded_canvas(tok):
    cfg = LisaConfig.tiny_defaults()
    model = _fresh(tok)
    prepare_for_training(model, cfg.lora_r, cfg.lora_alpha, 0.0)
    with torch.no_grad():  # logits of order 1 (the random tiny decoder gives ~1e-5, where BCE is ln 2 anywhere)
        for param in model.visual_model.mask_decoder.output_hypernetworks_mlps.parameters():
            param.mul_(50)
    grey = _image(18, 60)  # 64 px canvas: 19 × 64 resized, 70 % padding
    mask = np.zeros(grey.shape, bool)
    mask[4:14, 10:40] = True
    enc, clip, sam, gt, valid_hw = _inputs(model, tok, cfg, grey, mask)
    (h, w) = valid_hw[0]
    assert (h, w) == (19, 64)
    out = model(enc, clip, sam, gt, valid_hw)
    pred = model.canvas_logits(out.low_res).detach()
    bce = np.mean([sigmoid_bce(pred[i:i + 1, :h, :w], gt[i:i + 1, :h, :w]).item() for i in range(2)])
    assert out.bce.item() == pytest.approx(bce, rel=1e-5)
    assert out.dice.item() == pytest.approx(dice_loss(pred[:1, :h, :w], gt[:1, :h, :w]).item(), rel=1e-5)
    assert torch.allclose(out.total, 0.5 * out.txt + 5.0 * out.bce + 1.0 * out.dice)  # weights unchanged
    assert pred.abs().mean() > 0.1
    whole = model(enc, clip, sam, gt)  # without the sizes: the whole canvas, padding included
    assert abs(whole.bce.item() - out.bce.item()) > 1e-3 and abs(whole.dice.item() - out.dice.item()) > 1e-3


def test_training_batches_carry_each_samples_resized_size(tok, tmp_path):
    from cxrground.models.lisa.training import Sample, _batch

    cfg = LisaConfig.tiny_defaults(hist_eq_p=0.0)
    model = _fresh(tok)
    samples = []
    for i, (h, w) in enumerate([(30, 70), (90, 45)]):
        Image.fromarray(_image(h, w, i)).save(tmp_path / f"im{i}.png")
        samples.append(Sample(f"p{i}", tmp_path / f"im{i}.png", *NEG, None))
    batch = _batch(model, tok, cfg, samples, 0, 0, range(2), "cpu")
    assert len(batch) == 5
    assert batch[4] == [sam_frame((30, 70), 64).resized_hw, sam_frame((90, 45), 64).resized_hw] == [(27, 64),
                                                                                                      (64, 32)]
    out = model(*batch, weights=(cfg.w_txt, cfg.w_bce, cfg.w_dice))
    assert torch.isfinite(out.total)


# --- 3. CLIP shortest-side resize -----------------------------------------------------------------
#: sizes where int(224 · long / short) (the processor) and round() differ, and ones where they agree
CLIP_SIZES = [(200, 271), (271, 200), (257, 343), (333, 500), (301, 257), (224, 224)]


def _clip_reference(grey: np.ndarray, size: int = 224) -> np.ndarray:
    """transformers' CLIPImageProcessor arithmetic in plain PIL: short side → size, long side truncated."""
    h, w = grey.shape
    nh, nw = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    r = np.asarray(Image.fromarray(np.repeat(grey[:, :, None], 3, 2)).resize((nw, nh), Image.Resampling.BICUBIC))
    top, left = (nh - size) // 2, (nw - size) // 2
    r = r[top:top + size, left:left + size].astype(np.float32) / 255
    return ((r - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)).transpose(2, 0, 1)


def test_clip_long_side_is_truncated_as_the_processor_does():
    assert int(224 * 271 / 200) != round(224 * 271 / 200)  # the sizes below tell truncation from rounding
    for h, w in CLIP_SIZES:
        grey = _image(h, w)
        assert np.abs(clip_pixels(grey, 224) - _clip_reference(grey)).max() < 1e-5, (h, w)


def test_clip_pixels_match_transformers_clip_image_processor():
    transformers = pytest.importorskip("transformers")
    processor_cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    processor = processor_cls()  # the OpenAI CLIP ViT-L/14 defaults: shortest edge 224, bicubic, centre crop 224
    for h, w in CLIP_SIZES:
        grey = _image(h, w, seed=h)
        ref = processor(images=np.repeat(grey[:, :, None], 3, 2), return_tensors="np")["pixel_values"][0]
        assert np.abs(clip_pixels(grey, 224) - ref).max() < 1e-5, (h, w)


# --- 4. SAM input resize --------------------------------------------------------------------------
def _sam_reference(grey: np.ndarray, size: int) -> np.ndarray:
    """SAM's ResizeLongestSide.apply_image: int(x + 0.5) sizes, torchvision resize of a PIL image = PIL bilinear."""
    h, w = grey.shape
    scale = size * 1.0 / max(h, w)
    nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
    rgb = Image.fromarray(np.repeat(grey[:, :, None], 3, 2))
    try:
        from torchvision.transforms.functional import resize

        return np.array(resize(rgb, [nh, nw])).astype(np.float32)
    except ImportError:
        return np.asarray(rgb.resize((nw, nh), Image.Resampling.BILINEAR)).astype(np.float32)


@pytest.mark.parametrize("shape", [(1531, 1197), (777, 1301), (37, 53)])
def test_sam_input_is_resize_longest_side_bilinear(shape):
    grey = _image(*shape)
    ref = _sam_reference(grey, 1024)
    ours, box = sam_pixels(grey, 1024)
    nh, nw = ref.shape[:2]
    assert box.resized_hw == (nh, nw) and box.offset_yx == (0, 0)
    grey_levels = ours.transpose(1, 2, 0)[:nh, :nw] * np.asarray(SAM_STD, np.float32) + np.asarray(SAM_MEAN,
                                                                                                   np.float32)
    assert np.abs(grey_levels - ref).max() <= 1.0
    assert not ours[:, nh:].any() and not ours[:, :, nw:].any()  # zero padding after normalisation


def test_sam_frame_rounds_half_up_as_resize_longest_side():
    assert sam_frame((128, 65), 64).resized_hw == (64, 33)  # 32.5 → 33 (Python's round() gives 32)
    assert sam_frame((2048, 1025), 1024).resized_hw == (1024, 513)
    assert sam_frame((65, 128), 64).resized_hw == (33, 64)
