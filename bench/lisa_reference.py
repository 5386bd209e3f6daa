"""Does a LISA checkpoint written by ``export_released`` load and run in the reference ROSALIA / LISA code?

Run, in two environments:

1. ``.venv/bin/python bench/lisa_reference.py make --out DIR`` (the project's environment). Builds a
   tiny random model of the real architecture (LLaMA + CLIP + SAM, CLIP at 256 image tokens as ViT-L/14 at 224 px
   gives, which the reference assumes) with a SentencePiece LLaMA tokenizer in the released layout, writes it as
   a release, converts it (``convert_released``), exports it back (``export_released``, default arguments), saves
   the CLIP tower as a ``CLIPVisionModel`` folder the reference loads, and saves cxrground's outputs for one fixed
   instruction and random image (``DIR/ours.npz``, ``DIR/ours.json``). Prints one line per step.
2. ``python bench/lisa_reference.py load --out DIR --reference ROSALIA`` in an environment with the reference's
   transformers 4.31 and a checkout of https://github.com/KAIST-Edlab/ROSALIA. Such an environment, on top of one
   that has torch (nothing else is downloaded: the model, CLIP and tokenizer files are all in DIR)::

       python -m venv --system-site-packages refenv   # or any environment with torch, numpy, safetensors
       refenv/bin/pip install --no-deps transformers==4.31.0 tokenizers==0.13.3 peft==0.4.0 accelerate==0.21.0 \\
           huggingface_hub==0.16.4 einops==0.4.1 sentencepiece

   Loads the tokenizer and the model as ``inference_rosalia_example.py`` does (``AutoTokenizer(use_fast=False)``,
   ``LISAForCausalLM.from_pretrained`` + ``initialize_vision_modules``) and prints the loading report (missing,
   unexpected and mismatched keys), the tensors compared with the exported files, the tokenizer (class, size,
   ``[SEG]`` id, llava_v1 prompt ids against cxrground's), the LLM logits and the teacher-forced mask logits
   (``model_forward(inference=True)``) against cxrground's, and whether greedy generation (``evaluate``) gives
   cxrground's tokens. Exits 1 when a check fails.

The reference code is imported from the checkout at run time; nothing of it is copied here. What this check changes
in that process only: ``torchvision`` is stubbed when it is not installed (only parts of segment_anything that are not
used import it), ``Tensor.cuda`` is the identity on a CPU-only torch, and ``build_sam_vit_h`` builds the reference's
own segment_anything classes at the tiny model's sizes instead of SAM ViT-H. The reference receives cxrground's
pixel tensors, so the images' preprocessing is not part of the comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from functools import partial
from pathlib import Path

import numpy as np

INSTRUCTION = "Segment the edema in the right lung."
ANSWER = "[SEG] There is no edema."
MAX_NEW_TOKENS = 8
IMAGE_HW = (96, 80)  # not square: the SAM letterbox and the crop back to the image are compared too
CLIP_SIZE = 128  # patch 8 -> 256 image tokens; the reference hard-codes 255 (= 256 - 1) in its [SEG] positions
SEED = 1  # a seed whose random mask has both signs, so that the share of same pixels means something


def save_clip_folder(tower, folder: Path) -> None:
    """A ``CLIPVisionModel`` folder in transformers 4.x naming (``vision_model.*``) with its image processor."""
    from safetensors.torch import save_file
    from transformers import CLIPImageProcessor

    tower.config.save_pretrained(str(folder))
    state = {"vision_model." + k.removeprefix("vision_model."): v.contiguous() for k, v in tower.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    size = int(tower.config.image_size)
    CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(
        str(folder))


def make(out: Path) -> int:
    """Stage 1: the release, its conversion and export, the CLIP folder and cxrground's outputs under ``out``."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' release writers
    from cxrground.models.lisa.checkpoint import load_checkpoint
    from cxrground.models.lisa.config import LisaConfig
    from cxrground.models.lisa.convert import convert_released
    from cxrground.models.lisa.export import export_released
    from cxrground.models.lisa.infer import model_inputs
    from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch
    from cxrground.models.lisa.preprocess import logits_to_native
    from cxrground.models.lisa.text import encode, load_tokenizer, seg_token_id
    from test_models_lisa_convert import _write_folder, to_released
    from test_models_lisa_release import _train_spm, write_spm_tokenizer

    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    proto = _train_spm()
    tok = load_tokenizer(write_spm_tokenizer(out / "tokenizer", proto))
    torch.manual_seed(SEED)
    arch = tiny_arch(len(tok), 64)
    arch["clip"]["image_size"] = CLIP_SIZE
    model = LisaForSegmentation(arch, seg_token_id(tok))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval()

    release = _write_folder(out / "release", model, tok, to_released(model.state_dict()), "safetensors")
    (release / "tokenizer.json").unlink(missing_ok=True)  # a LLaMA release ships the slow tokenizer only
    write_spm_tokenizer(release, proto)
    print(f"release: {release} ({model.n_image_tokens} image tokens, vocabulary {len(tok)}, tokenizer files "
          f"{sorted(p.name for p in release.iterdir() if 'token' in p.name)})")
    (out / "clip").mkdir()
    save_clip_folder(model.vision_tower, out / "clip")

    ckpt = convert_released(release, out / "checkpoint", clip=out / "clip")
    notes: list[str] = []
    exported = export_released(ckpt, out / "exported", log=notes.append)
    print(f"export: {exported} ({sorted(p.name for p in exported.iterdir())})")
    for note in notes:
        print(f"export note: {note}")

    m, t, info = load_checkpoint(ckpt)
    config = LisaConfig.from_overrides(info["config"])
    grey = np.random.default_rng(1234).integers(0, 256, size=IMAGE_HW, dtype=np.uint8)
    clip_px, sam_px, box = model_inputs(m, config, grey)
    max_text = config.max_length - (m.n_image_tokens - 1)
    full, prompt = encode(t, INSTRUCTION, ANSWER, max_text), encode(t, INSTRUCTION, None, max_text)
    clip_t, sam_t = torch.as_tensor(clip_px[None]), torch.as_tensor(sam_px[None])
    with torch.no_grad():
        low = m.teacher_forced_low_res([full], clip_t, sam_t)[0].float().numpy()
        embeds, attn, _, _ = m.build_inputs([full], m.image_features(clip_t))
        llm_logits = m.language_model(inputs_embeds=embeds, attention_mask=attn).logits[0].float().numpy()
        greedy, _ = m.generate(prompt, clip_t, sam_t, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=int(t.eos_token_id),
                               pad_token_id=int(t.pad_token_id))
    mask_logits = logits_to_native(low, box)
    np.savez(out / "ours.npz", grey=grey, clip_px=clip_px, sam_px=sam_px, mask_logits=mask_logits,
             llm_logits=llm_logits)
    ours = {"instruction": INSTRUCTION, "answer": ANSWER, "max_new_tokens": MAX_NEW_TOKENS,
            "tokenizer_size": len(t), "seg_id": seg_token_id(t), "prompt_ids": list(prompt.input_ids),
            "full_ids": list(full.input_ids), "greedy_ids": greedy, "image_hw": list(grey.shape),
            "sam_resized_hw": list(box.resized_hw), "sam": info["arch"]["sam"]}
    (out / "ours.json").write_text(json.dumps(ours, indent=1))
    print(f"cxrground: tokenizer {type(t).__name__} {len(t)} tokens, [SEG] {seg_token_id(t)}, prompt "
          f"{len(prompt.input_ids)} ids, full sequence {len(full.input_ids)} ids")
    print(f"cxrground: mask logits {mask_logits.shape}, {100 * float((mask_logits > 0).mean()):.0f} % positive; "
          f"LLM logits {llm_logits.shape}; greedy tokens {greedy}")
    print(f"saved {out / 'ours.npz'} and {out / 'ours.json'}")
    return 0


def _stub_torchvision() -> None:
    """Empty ``torchvision`` modules for the imports of segment_anything parts this check does not use."""

    def unavailable(*args, **kwargs):
        raise RuntimeError("torchvision is not installed (stubbed by bench/lisa_reference.py)")

    names = ("torchvision", "torchvision.ops", "torchvision.ops.boxes", "torchvision.transforms",
             "torchvision.transforms.functional", "torchvision.utils")
    mods = {name: types.ModuleType(name) for name in names}
    mods["torchvision.ops.boxes"].batched_nms = mods["torchvision.ops.boxes"].box_area = unavailable
    mods["torchvision.transforms.functional"].resize = mods["torchvision.transforms.functional"].to_pil_image = \
        unavailable
    mods["torchvision.transforms.functional"].InterpolationMode = types.SimpleNamespace(BILINEAR="bilinear")
    mods["torchvision.utils"].save_image = unavailable
    sys.modules.update(mods)


def tiny_sam_builder(sam: dict, modeling):
    """``build_sam_vit_h`` of the reference at the sizes of cxrground's SAM config ``sam`` (loads no weights)."""
    import torch

    vis, prm, dec = sam["vision_config"], sam["prompt_encoder_config"], sam["mask_decoder_config"]
    size, patch, dim = int(vis["image_size"]), int(vis["patch_size"]), int(vis["output_channels"])

    def build(checkpoint=None):
        encoder = modeling.ImageEncoderViT(
            depth=vis["num_hidden_layers"], embed_dim=vis["hidden_size"], img_size=size,
            mlp_ratio=vis["mlp_dim"] / vis["hidden_size"], norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_heads=vis["num_attention_heads"], patch_size=patch, qkv_bias=True, use_rel_pos=True,
            global_attn_indexes=vis["global_attn_indexes"], window_size=vis["window_size"], out_chans=dim)
        prompt = modeling.PromptEncoder(embed_dim=dim, image_embedding_size=(size // patch, size // patch),
                                        input_image_size=(size, size), mask_in_chans=prm["mask_input_channels"])
        decoder = modeling.MaskDecoder(
            num_multimask_outputs=3, transformer_dim=dim, iou_head_depth=3,
            iou_head_hidden_dim=dec["iou_head_hidden_dim"],
            transformer=modeling.TwoWayTransformer(depth=2, embedding_dim=dim, mlp_dim=dec["mlp_dim"],
                                                   num_heads=dec["num_attention_heads"]))
        return modeling.Sam(image_encoder=encoder, prompt_encoder=prompt, mask_decoder=decoder,
                            pixel_mean=[123.675, 116.28, 103.53], pixel_std=[58.395, 57.12, 57.375]).eval()

    return build


def _scale(values: np.ndarray, diff: float) -> str:
    """The largest absolute value of ``values`` and ``diff`` relative to it, as printed."""
    scale = float(np.abs(values).max())
    return f"logit scale {scale:.2g}, relative {diff / scale:.2g}" if scale > 0 else "all logits 0"


def load(out: Path, reference: Path, atol: float) -> int:
    """Stage 2: load ``out/exported`` with the reference code and compare it with ``out/ours.*``."""
    import torch
    import transformers  # before the torchvision stub: transformers probes torchvision when imported
    from safetensors.torch import load_file

    transformers.logging.set_verbosity_error()  # the loading report is printed below, in counts

    sys.path.insert(0, str(reference.resolve()))
    if importlib.util.find_spec("torchvision") is None:
        _stub_torchvision()
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
    import model.LISA as LISA
    from model.llava import conversation as conversation_lib
    from model.llava.mm_utils import tokenizer_image_token
    from model.segment_anything import modeling
    from utils.utils import DEFAULT_IM_END_TOKEN, DEFAULT_IM_START_TOKEN, DEFAULT_IMAGE_TOKEN

    ours = json.loads((out / "ours.json").read_text())
    arrays = np.load(out / "ours.npz")
    exported, failures = out / "exported", []
    LISA.build_sam_vit_h = tiny_sam_builder(ours["sam"], modeling)

    def check(ok: bool, line: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
        if not ok:
            failures.append(line)

    print(f"reference: {reference} with transformers {transformers.__version__}, torch {torch.__version__}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported), cache_dir=None, model_max_length=512,
                                                               padding_side="right", use_fast=False)
        tokenizer.pad_token = tokenizer.unk_token
        seg_id = tokenizer("[SEG]", add_special_tokens=False).input_ids[0]
    except Exception as exc:  # a failed check; the weights are still compared
        tokenizer, seg_id = None, ours["seg_id"]
        check(False, f"tokenizer: AutoTokenizer(use_fast=False) fails: {type(exc).__name__}: {exc}")

    model, info = LISA.LISAForCausalLM.from_pretrained(
        str(exported), low_cpu_mem_usage=True, vision_tower=str(out / "clip"), seg_token_idx=seg_id,
        torch_dtype=torch.float32, output_loading_info=True)
    missing, unexpected = list(info["missing_keys"]), list(info["unexpected_keys"])
    rotary = [k for k in missing if k.endswith(".rotary_emb.inv_freq")]
    tower = [k for k in unexpected if k.startswith("model.vision_tower.")]
    check(len(rotary) == len(missing), f"missing keys: {len(missing)} ({len(rotary)} rotary inv_freq buffers, which "
          "transformers 4.31 recomputes at init and the export leaves out)")
    check(len(tower) == len(unexpected), f"unexpected keys: {len(unexpected)} ({len(tower)} CLIP tower tensors: the "
          "reference builds the tower later, from vision_tower=, in initialize_vision_modules)")
    check(not info["mismatched_keys"] and not info["error_msgs"],
          f"mismatched keys: {len(info['mismatched_keys'])}, loading errors: {len(info['error_msgs'])}")
    if tokenizer is not None:
        model.config.eos_token_id, model.config.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    model.get_model().initialize_vision_modules(model.get_model().config)
    model.get_model().get_vision_tower().to(dtype=torch.float32)
    model = model.float().eval()

    index = json.loads((exported / "model.safetensors.index.json").read_text())
    files = {}
    for name in sorted(set(index["weight_map"].values())):
        files.update(load_file(str(exported / name)))
    state = model.state_dict()
    compared = [k for k in files if k in state]
    differ = [k for k in compared if files[k].shape != state[k].shape or not torch.equal(files[k].to(state[k].dtype),
                                                                                           state[k])]
    only_model = [k for k in state if k not in files and not k.endswith(".rotary_emb.inv_freq")]
    check(not differ and len(compared) == len(files) and not only_model,
          f"tensors: {len(files)} exported, {len(compared)} compared with the loaded model, {len(differ)} differ, "
          f"{len(files) - len(compared)} not in the model, {len(only_model)} model tensors not exported")

    conv = conversation_lib.conv_templates["llava_v1"].copy()
    conv.messages = []
    image = DEFAULT_IM_START_TOKEN + DEFAULT_IMAGE_TOKEN + DEFAULT_IM_END_TOKEN
    conv.append_message(conv.roles[0], image + "\n" + ours["instruction"])
    conv.append_message(conv.roles[1], "")
    prompt_ids = ours["prompt_ids"]
    if tokenizer is not None:
        prompt_ids = tokenizer_image_token(conv.get_prompt(), tokenizer)
        conv.messages[-1][1] = ours["answer"]
        full_ids = tokenizer_image_token(conv.get_prompt(), tokenizer)
        check(len(tokenizer) == ours["tokenizer_size"] and seg_id == ours["seg_id"],
              f"tokenizer: {type(tokenizer).__name__}, {len(tokenizer)} tokens (cxrground {ours['tokenizer_size']}), "
              f"[SEG] id {seg_id} (cxrground {ours['seg_id']})")
        check(prompt_ids == ours["prompt_ids"] and full_ids == ours["full_ids"],
              f"llava_v1 ids equal to cxrground's: prompt {prompt_ids == ours['prompt_ids']} ({len(prompt_ids)} ids), "
              f"prompt + answer {full_ids == ours['full_ids']} ({len(full_ids)} ids)")

    clip_px = torch.as_tensor(arrays["clip_px"])[None]
    sam_px = torch.as_tensor(arrays["sam_px"])[None]
    full = torch.as_tensor(ours["full_ids"])[None]
    with torch.no_grad():
        logits = super(LISA.LISAForCausalLM, model).forward(images=clip_px, input_ids=full,
                                                            attention_mask=torch.ones_like(full)).logits[0].numpy()
    mine = arrays["llm_logits"]
    diff = float(np.abs(logits - mine).max()) if logits.shape == mine.shape else float("inf")
    check(diff <= atol, f"LLM logits on the teacher-forced sequence: shape {logits.shape} (cxrground {mine.shape}), "
          f"max abs diff {diff:.2g} ({_scale(mine, diff)})")

    hw = tuple(ours["image_hw"])
    with torch.no_grad():
        res = model.model_forward(images=sam_px, images_clip=clip_px, input_ids=full, labels=None,
                                  attention_masks=torch.ones_like(full), offset=torch.tensor([0, 1]),
                                  masks_list=[torch.zeros(1, *hw)], label_list=[torch.zeros(hw)],
                                  resize_list=[tuple(ours["sam_resized_hw"])], inference=True)
    pred, mine = res["pred_masks"][0].numpy(), arrays["mask_logits"]
    diff = float(np.abs(pred[0] - mine).max()) if pred.shape == (1, *mine.shape) else float("inf")
    agree = 100 * float(((pred[0] > 0) == (mine > 0)).mean()) if diff < float("inf") else 0.0
    check(diff <= atol, f"teacher-forced mask (model_forward inference=True): shape {pred.shape} for a {hw} image, "
          f"max abs diff of mask logits {diff:.2g} ({_scale(mine, diff)}), {agree:.1f} % same pixels")

    ids = torch.as_tensor(prompt_ids)[None]
    with torch.no_grad():
        output_ids, masks = model.evaluate(clip_px, sam_px, ids, [tuple(ours["sam_resized_hw"])], [hw],
                                           max_new_tokens=ours["max_new_tokens"], tokenizer=tokenizer)
    greedy = [int(x) for x in output_ids[0, ids.shape[1]:]]
    check(greedy == ours["greedy_ids"], f"greedy tokens (evaluate, {ours['max_new_tokens']} new): {greedy}, "
          f"cxrground {ours['greedy_ids']}; {masks[0].shape[0]} mask(s)")

    print(f"{'all checks passed' if not failures else f'{len(failures)} check(s) failed'}")
    return 1 if failures else 0


def main() -> int:
    """Parse the command line and run one stage."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("make", "load"))
    parser.add_argument("--out", type=Path, required=True, help="folder of the export and of cxrground's outputs")
    parser.add_argument("--reference", type=Path, help="ROSALIA (or LISA) checkout, for load")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest max abs diff of logits that passes")
    args = parser.parse_args()
    if args.stage == "make":
        return make(args.out)
    if args.reference is None:
        parser.error("load needs --reference")
    return load(args.out, args.reference, args.atol)


if __name__ == "__main__":
    sys.exit(main())
