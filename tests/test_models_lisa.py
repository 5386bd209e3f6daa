"""The LISA model (ILS.md §17) on tiny random configurations, CPU only."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cxrground.errors import ConfigError  # noqa: E402
from cxrground.io.image import CXRImage  # noqa: E402
from cxrground.io.transform import Letterbox  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.infer import LisaPredictor, model_inputs, teacher_forced_masks  # noqa: E402
from cxrground.models.lisa.model import (  # noqa: E402
    LisaForSegmentation,
    lora_target_names,
    merged_state_dict,
    prepare_for_training,
    tiny_arch,
)
from cxrground.models.lisa.preprocess import (  # noqa: E402
    SAM_MEAN,
    SAM_STD,
    clip_pixels,
    gt_mask_canvas,
    logits_to_native,
    sam_frame,
    sam_pixels,
)
from cxrground.models.lisa.text import (  # noqa: E402
    IGNORE_INDEX,
    answer_text,
    encode,
    seg_token_id,
    tiny_tokenizer,
)
from cxrground.models.losses import dice_loss, sigmoid_bce  # noqa: E402
from cxrground.vocab import ils_templates as T  # noqa: E402

H, W = 37, 53
POS = ("Segment the edema in the right lung.", "[SEG]")
NEG = ("Segment the edema.", "[SEG] There is no edema.")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def cfg():
    return LisaConfig.tiny_defaults()


def _image(seed: int = 0) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    img = 60 + 100 * np.exp(-((yy - 18) ** 2 + (xx - 14) ** 2) / 60.0)
    return (img + np.random.default_rng(seed).normal(0, 3, (H, W))).clip(0, 255).astype(np.uint8)


def _mask() -> np.ndarray:
    m = np.zeros((H, W), bool)
    m[10:26, 6:24] = True
    return m


def _fresh(tok, seed: int = 0) -> LisaForSegmentation:
    torch.manual_seed(seed)
    return LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))


def _batch(model, tok, cfg):
    img = _image()
    c, s, box = model_inputs(model, cfg, img)
    max_text = cfg.max_length - model.n_image_tokens + 1
    enc = [encode(tok, *POS, max_text), encode(tok, *NEG, max_text)]
    gt = torch.tensor(np.stack([gt_mask_canvas(_mask(), box), gt_mask_canvas(None, box)]))
    return enc, torch.tensor(np.stack([c, c])), torch.tensor(np.stack([s, s])), gt


@pytest.fixture(scope="module")
def trained(tok, cfg):
    """A tiny model trained 10 steps on a fixed batch, with its loss history."""
    model = _fresh(tok)
    prepare_for_training(model, cfg.lora_r, cfg.lora_alpha, 0.0)
    batch = _batch(model, tok, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95))
    losses = []
    model.train()
    for _ in range(10):
        out = model(*batch)
        opt.zero_grad()
        out.total.backward()
        opt.step()
        losses.append((out.total.item(), out.txt.item(), out.bce.item()))
    return model.eval(), losses


# --- tokens ---------------------------------------------------------------------------------------
def test_seg_token_resolved_through_vocabulary(tok):
    seg = seg_token_id(tok)
    assert tok.convert_tokens_to_ids(T.SEG_TOKEN) == seg
    enc = encode(tok, *NEG, 500)
    assert enc.input_ids.count(seg) == 1
    assert tok.convert_tokens_to_ids(T.IM_START) in enc.input_ids
    assert tok.convert_tokens_to_ids(T.IM_END) in enc.input_ids
    # the image is a placeholder, not a vocabulary token
    assert tok.convert_tokens_to_ids(T.IMAGE_TOKEN) not in enc.input_ids
    # a vocabulary without [SEG] (lookup falls back to unk) is refused
    class NoSeg:
        unk_token_id = tok.unk_token_id

        def convert_tokens_to_ids(self, tokens):
            return [tok.unk_token_id for _ in tokens]

    with pytest.raises(ConfigError):
        seg_token_id(NoSeg())


def test_labels_cover_only_the_answer(tok):
    enc = encode(tok, *NEG, 500)
    supervised = [t for t, lab in zip(enc.input_ids, enc.labels, strict=True) if lab != IGNORE_INDEX]
    assert supervised[-1] == tok.eos_token_id
    # the reference strips the whitespace after [SEG] when tokenising (issue 12); answer_text puts it back
    assert tok.decode(supervised, skip_special_tokens=False).strip() == NEG[1].replace("[SEG] ", "[SEG]") + T.EOS
    assert answer_text(tok, supervised) == NEG[1]
    prompt = encode(tok, NEG[0], None, 500)
    assert enc.input_ids[:len(prompt.input_ids)] == prompt.input_ids
    # truncation to max_text tokens
    assert len(encode(tok, *NEG, 20).input_ids) == 20


# --- configuration --------------------------------------------------------------------------------
def test_default_config_is_the_paper_configuration():
    c = LisaConfig(base_model="/models/LISA-7B-v1")
    assert (c.lora_r, c.lora_alpha, c.lora_dropout) == (128, 256, 0.05)
    assert (c.w_txt, c.w_bce, c.w_dice) == (0.5, 5.0, 1.0)
    assert (c.lr, c.betas, c.weight_decay, c.warmup_steps, c.grad_clip) == (3e-4, (0.9, 0.95), 0.0, 100, 1.0)
    assert (c.epochs, c.batch_size, c.max_length, c.sam_image_size) == (15, 256, 512, 1024)
    assert (c.clip_mode, c.hist_eq_p, c.max_new_tokens) == ("center_crop", 0.5, 512)
    o = LisaConfig.from_overrides({"base_model": "/m", "lora_r": "8", "clip_mode": "pad", "hist_eq_p": "0"})
    assert (o.lora_r, o.clip_mode, o.hist_eq_p) == (8, "pad", 0.0)
    with pytest.raises(ConfigError):
        LisaConfig.from_overrides({"base_model": "/m", "lora_rank": 8})
    with pytest.raises(ConfigError):
        LisaConfig.from_overrides({})  # neither base_model nor tiny
    assert LisaConfig.from_overrides({"tiny": "true"}).tiny


# --- LoRA and trainable parts ---------------------------------------------------------------------
def test_lora_targets_and_trainable_parts(tok, cfg):
    model = _fresh(tok)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    targets = prepare_for_training(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout)
    expected = {f"language_model.model.layers.{i}.{part}" for i in range(2) for part in
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")} | {"language_model.lm_head"}
    assert set(targets) == expected
    assert {n for n in linears if n.startswith("language_model.")} == expected
    wrapped = {n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert wrapped == expected
    assert not any(n.startswith(("visual_model", "vision_tower", "mm_projector", "text_hidden_fcs")) for n in wrapped)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert all(any(n.startswith(p) for n in trainable) for p in (
        "language_model.lm_head.base_layer", "language_model.model.embed_tokens", "visual_model.mask_decoder",
        "text_hidden_fcs"))
    assert all(n.startswith(("language_model.model.embed_tokens", "language_model.lm_head", "visual_model.mask_decoder",
                             "text_hidden_fcs")) or "lora_" in n for n in trainable)
    for prefix in ("vision_tower.", "mm_projector.", "visual_model.vision_encoder.", "visual_model.prompt_encoder.",
                   "language_model.model.layers.0.self_attn.q_proj.base_layer", "language_model.model.norm"):
        assert any(n.startswith(prefix) for n in frozen) and not any(n.startswith(prefix) for n in trainable)
    assert lora_target_names(_fresh(tok)) == targets


# --- losses, forward/backward ---------------------------------------------------------------------
def test_loss_is_the_weighted_sum_with_bce_on_all_and_dice_on_positives(tok, cfg):
    model = _fresh(tok)
    prepare_for_training(model, cfg.lora_r, cfg.lora_alpha, 0.0)
    enc, clip, sam, gt = _batch(model, tok, cfg)
    out = model(enc, clip, sam, gt)
    bce_value = float(out.bce.detach())
    assert torch.allclose(out.total, 0.5 * out.txt + 5.0 * out.bce + 1.0 * out.dice)
    pred = model.canvas_logits(out.low_res)
    assert torch.allclose(out.bce, sigmoid_bce(pred, gt))
    per_mask = [sigmoid_bce(pred[i:i + 1], gt[i:i + 1]).item() for i in range(2)]
    assert bce_value == pytest.approx(np.mean(per_mask), rel=1e-5)  # the negative counts in BCE
    assert out.dice.item() == pytest.approx(dice_loss(pred[:1], gt[:1]).item(), rel=1e-5)  # positive only
    # text loss: cross-entropy over the answer tokens only
    embeds, attn, labels, _ = model.build_inputs(enc, model.image_features(clip))
    logits = model.language_model(inputs_embeds=embeds, attention_mask=attn).logits
    lab = labels[:, 1:]
    keep = lab != IGNORE_INDEX
    manual = torch.nn.functional.cross_entropy(logits[:, :-1][keep], lab[keep]).detach()
    assert out.txt.item() == pytest.approx(manual.item(), rel=1e-4)
    n_answer = sum(len(tok(a, add_special_tokens=False).input_ids) for a in (POS[1], NEG[1])) + 2
    assert int(keep.sum()) in range(n_answer - 2, n_answer + 3)  # answers + </s> (+ a separator piece)
    # backward reaches the trained parts and never the frozen SAM image encoder
    out.total.backward()
    named = dict(model.named_parameters())
    assert named["text_hidden_fcs.0.weight"].grad is not None
    assert named["visual_model.mask_decoder.mask_tokens.weight"].grad is not None
    assert any(p.grad is not None for n, p in named.items() if "lora_B" in n)
    assert all(p.grad is None for n, p in named.items() if n.startswith("visual_model.vision_encoder."))


def test_loss_decreases_on_a_fixed_batch(trained):
    _, losses = trained
    totals = [t for t, _, _ in losses]
    assert totals[-1] < totals[0] * 0.9
    assert losses[-1][1] < losses[0][1]  # text
    assert losses[-1][2] < losses[0][2]  # BCE


def test_merged_weights_reproduce_the_lora_model(trained, tok, cfg):
    model, _ = trained
    plain = _fresh(tok, seed=5)
    plain.load_state_dict(merged_state_dict(model), strict=True)
    plain.eval()
    enc, clip, sam, _ = _batch(model, tok, cfg)
    a = model.teacher_forced_low_res(enc, clip, sam)
    b = plain.teacher_forced_low_res(enc, clip, sam)
    assert torch.allclose(a, b, atol=1e-4)


# --- inference ------------------------------------------------------------------------------------
def test_teacher_forced_masks_are_native_size(trained, tok, cfg):
    model, _ = trained
    masks = teacher_forced_masks(model, tok, cfg, [(_image(), *POS), (_image(1)[:, :40], *NEG)])
    assert masks[0].shape == (H, W) and masks[0].dtype == bool
    assert masks[1].shape == (H, 40)


def test_free_generation_returns_text_and_a_native_mask(trained, tok, cfg):
    model, _ = trained
    predictor = LisaPredictor(model, tok, cfg)
    out = predictor.predict(CXRImage(_image()), NEG[0])
    assert isinstance(out.answer, str) and out.answer
    assert T.EOS not in out.answer and T.IM_START not in out.answer
    assert out.mask.shape == (H, W) and out.mask.dtype == bool
    assert out.extra["seg_generated"]  # the trained tiny model answers with [SEG] first
    assert out.answer.startswith(T.SEG_TOKEN)
    assert out.presence == float(out.mask.any()) and out.present == bool(out.mask.any())
    assert (out.kind, out.lesion, out.locations) == ("global", "edema", [])
    basic = predictor.predict(CXRImage(_image()[:, :29]), POS[0])
    assert basic.mask.shape == (H, 29) and basic.locations == ["right lung"] and basic.kind == "basic"
    both = predictor.predict_batch([CXRImage(_image())], [NEG[0]])
    assert both[0].answer == out.answer and np.array_equal(both[0].mask, out.mask)


def test_generation_without_seg_gives_an_empty_mask(trained, tok, cfg):
    model, _ = trained
    predictor = LisaPredictor(model, tok, LisaConfig.tiny_defaults(max_new_tokens=1))
    seg = seg_token_id(tok)
    with torch.no_grad():
        bias = torch.zeros(len(tok))
        bias[seg] = -1e4  # forbid [SEG]
        head = model.language_model.lm_head
        old = head.forward
        head.forward = lambda x: old(x) + bias
        try:
            out = predictor.predict(CXRImage(_image()), NEG[0])
        finally:
            del head.forward
    assert not out.extra["seg_generated"]
    assert out.mask.shape == (H, W) and not out.mask.any() and out.presence == 0.0


# --- preprocessing --------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1024, 64])
def test_mask_round_trip_native_to_sam_frame_is_exact(size):
    mask = _mask()
    mask[0, 0] = mask[-1, -1] = True
    box = sam_frame((H, W), size)
    assert box.offset_yx == (0, 0) and box.resized_hw[1] == size  # longest side, bottom/right padding
    canvas = gt_mask_canvas(mask, box)
    assert canvas.shape == (size, size)
    assert not canvas[box.resized_hw[0]:].any()
    assert np.array_equal(box.mask_to_native(canvas > 0.5), mask)


def test_sam_and_clip_branches():
    img = _image()
    sam, box = sam_pixels(img, 64)
    assert sam.shape == (3, 64, 64)
    rh = box.resized_hw[0]
    assert np.all(sam[:, rh:] == 0)  # zero padding after normalisation
    expected = (float(Letterbox.longest_side((H, W), 64).image_to_canvas(img)[0, 0]) - SAM_MEAN[0]) / SAM_STD[0]
    assert sam[0, 0, 0] == pytest.approx(expected, rel=1e-5)
    wide = np.zeros((20, 60), np.uint8)
    wide[:, :6] = 255  # a bright strip at the left edge
    crop = clip_pixels(wide, 32, "center_crop")
    pad = clip_pixels(wide, 32, "pad")
    assert crop.shape == pad.shape == (3, 32, 32)
    assert crop.max() < 0  # the strip is cropped away
    assert pad.max() > 1  # the strip survives pad-to-square
    with pytest.raises(ValueError):
        clip_pixels(wide, 32, "stretch")


def test_low_res_logits_map_back_to_native_size():
    mask = _mask()
    box = sam_frame((H, W), 64)
    canvas = torch.tensor(gt_mask_canvas(mask, box) * 20 - 10)
    low = torch.nn.functional.avg_pool2d(canvas[None, None], 4)[0, 0].numpy()
    native = logits_to_native(low, box) > 0
    assert native.shape == (H, W)
    inter, union = (native & mask).sum(), (native | mask).sum()
    assert inter / union > 0.8


# --- train() + load_model() -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ils_dataset(tmp_path_factory):
    from click.testing import CliRunner

    from cxrground.cli import main

    root = tmp_path_factory.mktemp("lisa_ils")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "0"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0"])
    assert r.exit_code == 0, r.output
    return root / "ils", root / "cohort" / "files"


def test_train_then_load_model_smoke(ils_dataset, tmp_path):
    from cxrground.io.image import read_image
    from cxrground.models.base import load_model
    from cxrground.models.lisa import train

    dataset, images = ils_dataset
    out = train(dataset, tmp_path / "ckpt", images=images, seed=0, overrides={"tiny": True, "max_steps": 1},
                val_split="train")
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["model"] == "lisa" and info["step"] == 1 and info["seed"] == 0
    assert len(info["dataset_hash"]) == 64 and info["config"]["tiny"] and info["config"]["max_steps"] == 1
    assert info["history"][0]["n_pos"] > 0 and (out / "best" / "checkpoint.json").is_file()
    data = json.loads((dataset / "mimic_ils_instruction_answer.json").read_text())
    study = next(iter(data["train"].values()))
    image = read_image(images / study["image_path"])
    model = load_model(out)
    assert model.name == "lisa"
    pred = model.predict(image, study["instruction_answer_pairs"]["positive_pairs"][0]["instruction"])
    assert pred.mask.shape == image.shape and isinstance(pred.answer, str)
    # resuming a finished run does no more steps; another seed refuses the saved state
    again = train(dataset, tmp_path / "ckpt", images=images, seed=0, overrides={"tiny": True, "max_steps": 1},
                  val_split="train")
    assert json.loads((again / "checkpoint.json").read_text())["step"] == 1
    with pytest.raises(ConfigError):
        train(dataset, tmp_path / "ckpt", images=images, seed=1, overrides={"tiny": True, "max_steps": 1},
              val_split=None)


def test_pairs_whose_seg_token_is_cut_off_are_refused_before_training(tok, tmp_path):
    from cxrground.errors import InputError
    from cxrground.models.lisa.training import Sample, check_fit

    model = _fresh(tok)
    short = Sample("p0", tmp_path / "a.png", *POS, None)
    long = Sample("p1", tmp_path / "a.png", "Segment the opacity in the " + "right upper zone lung, " * 20 + "lung.",
                  "[SEG] There is no opacity.", None)
    cfg = LisaConfig.tiny_defaults()
    check_fit(tok, cfg, model.n_image_tokens, [short], tmp_path / "d.json")
    with pytest.raises(InputError, match=r"1 distinct .*\[SEG\] token at max_length=160.*pair p1.*max_length"):
        check_fit(tok, cfg, model.n_image_tokens, [short, long], tmp_path / "d.json")
    check_fit(tok, LisaConfig.tiny_defaults(max_length=1024), model.n_image_tokens, [short, long], tmp_path / "d.json")


def test_train_on_a_released_frame_dataset(ils_dataset, tmp_path):
    """MIMIC-ILS as published (512² masks, the whole image stretched): the samples know the frame, and training
    reads each mask back on its image's native grid."""
    from cxrground.ils.frames import export_dataset, read_native_mask
    from cxrground.io.image import read_image
    from cxrground.io.masks import read_mask_png
    from cxrground.models.lisa import train
    from cxrground.models.lisa.training import load_samples

    dataset, images = ils_dataset
    export_dataset(dataset, tmp_path / "released")
    samples, _ = load_samples(tmp_path / "released", images, "train")
    positive = next(s for s in samples if s.mask is not None)
    assert positive.released_size == 512
    shape = read_image(positive.image).pixels.shape
    native = read_mask_png(dataset / "lesion_mask" / positive.mask.relative_to(tmp_path / "released" / "lesion_mask"))
    back = read_native_mask(positive.mask, shape, positive.released_size)
    assert back.shape == shape and (back & native).sum() / (back | native).sum() > 0.8
    out = train(tmp_path / "released", tmp_path / "ckpt", images=images, seed=0,
                overrides={"tiny": True, "max_steps": 1}, val_split="train")
    assert json.loads((out / "checkpoint.json").read_text())["step"] == 1
