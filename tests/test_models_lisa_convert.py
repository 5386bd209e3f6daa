"""Converter from the released LISA / ROSALIA layout, on a tiny model written in that layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cxrground.errors import ConfigError, InputError  # noqa: E402
from cxrground.models.lisa.convert import convert_released, load_released_model, map_key  # noqa: E402
from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch  # noqa: E402
from cxrground.models.lisa.text import encode, seg_token_id, tiny_tokenizer  # noqa: E402

#: segment-anything → transformers names written out by hand (inverse direction), for the test layout.
_SA_INVERSE = (
    (r"^vision_encoder\.", "image_encoder."),
    (r"^image_encoder\.patch_embed\.projection\.", "image_encoder.patch_embed.proj."),
    (r"^image_encoder\.layers\.(\d+)\.layer_norm(\d)\.", r"image_encoder.blocks.\1.norm\2."),
    (r"^image_encoder\.layers\.", "image_encoder.blocks."),
    (r"^image_encoder\.neck\.conv1\.", "image_encoder.neck.0."),
    (r"^image_encoder\.neck\.layer_norm1\.", "image_encoder.neck.1."),
    (r"^image_encoder\.neck\.conv2\.", "image_encoder.neck.2."),
    (r"^image_encoder\.neck\.layer_norm2\.", "image_encoder.neck.3."),
    (r"^prompt_encoder\.shared_embedding\.positional_embedding$",
     "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"),
    (r"^prompt_encoder\.point_embed\.", "prompt_encoder.point_embeddings."),
    (r"^prompt_encoder\.mask_embed\.conv1\.", "prompt_encoder.mask_downscaling.0."),
    (r"^prompt_encoder\.mask_embed\.layer_norm1\.", "prompt_encoder.mask_downscaling.1."),
    (r"^prompt_encoder\.mask_embed\.conv2\.", "prompt_encoder.mask_downscaling.3."),
    (r"^prompt_encoder\.mask_embed\.layer_norm2\.", "prompt_encoder.mask_downscaling.4."),
    (r"^prompt_encoder\.mask_embed\.conv3\.", "prompt_encoder.mask_downscaling.6."),
    (r"^mask_decoder\.upscale_conv1\.", "mask_decoder.output_upscaling.0."),
    (r"^mask_decoder\.upscale_layer_norm\.", "mask_decoder.output_upscaling.1."),
    (r"^mask_decoder\.upscale_conv2\.", "mask_decoder.output_upscaling.3."),
    (r"^mask_decoder\.transformer\.layers\.(\d+)\.layer_norm(\d)\.", r"mask_decoder.transformer.layers.\1.norm\2."),
    (r"^mask_decoder\.transformer\.layer_norm_final_attn\.", "mask_decoder.transformer.norm_final_attn."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.0\.", r"\1.layers.1."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_in\.", r"\1.layers.0."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_out\.", r"\1.layers.2."),
)

#: Names that exist in the real checkpoints (segment-anything ``sam_vit_h_4b8939.pth`` and LISA-7B-v1).
_VM = "model.visual_model."
KNOWN_RELEASED_KEYS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.mm_projector.weight",
    "model.mm_projector.bias",
    "model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight",
    "model.text_hidden_fcs.0.0.weight",
    "model.text_hidden_fcs.0.0.bias",
    "model.text_hidden_fcs.0.2.weight",
    "model.text_hidden_fcs.0.2.bias",
    _VM + "image_encoder.pos_embed",
    _VM + "image_encoder.patch_embed.proj.weight",
    _VM + "image_encoder.blocks.0.norm1.weight",
    _VM + "image_encoder.blocks.0.attn.qkv.weight",
    _VM + "image_encoder.blocks.1.attn.rel_pos_h",
    _VM + "image_encoder.blocks.0.mlp.lin1.weight",
    _VM + "image_encoder.neck.0.weight",
    _VM + "image_encoder.neck.1.bias",
    _VM + "image_encoder.neck.2.weight",
    _VM + "image_encoder.neck.3.weight",
    _VM + "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix",
    _VM + "prompt_encoder.point_embeddings.3.weight",
    _VM + "prompt_encoder.not_a_point_embed.weight",
    _VM + "prompt_encoder.no_mask_embed.weight",
    _VM + "prompt_encoder.mask_downscaling.0.weight",
    _VM + "prompt_encoder.mask_downscaling.1.weight",
    _VM + "prompt_encoder.mask_downscaling.3.weight",
    _VM + "prompt_encoder.mask_downscaling.4.bias",
    _VM + "prompt_encoder.mask_downscaling.6.weight",
    _VM + "mask_decoder.transformer.layers.0.self_attn.q_proj.weight",
    _VM + "mask_decoder.transformer.layers.0.norm1.weight",
    _VM + "mask_decoder.transformer.layers.1.norm4.bias",
    _VM + "mask_decoder.transformer.layers.0.cross_attn_token_to_image.out_proj.bias",
    _VM + "mask_decoder.transformer.layers.0.mlp.lin2.weight",
    _VM + "mask_decoder.transformer.final_attn_token_to_image.v_proj.weight",
    _VM + "mask_decoder.transformer.norm_final_attn.weight",
    _VM + "mask_decoder.iou_token.weight",
    _VM + "mask_decoder.mask_tokens.weight",
    _VM + "mask_decoder.output_upscaling.0.weight",
    _VM + "mask_decoder.output_upscaling.1.weight",
    _VM + "mask_decoder.output_upscaling.3.bias",
    _VM + "mask_decoder.output_hypernetworks_mlps.0.layers.0.weight",
    _VM + "mask_decoder.output_hypernetworks_mlps.3.layers.1.weight",
    _VM + "mask_decoder.output_hypernetworks_mlps.2.layers.2.bias",
    _VM + "mask_decoder.iou_prediction_head.layers.1.weight",
    _VM + "mask_decoder.iou_prediction_head.layers.2.bias",
]


def _sa_name(key: str) -> str:
    for pattern, repl in _SA_INVERSE:
        key = re.sub(pattern, repl, key, count=1)
    return key


def to_released(state: dict) -> dict:
    """Our names → the released LISA layout (written independently of the converter's table)."""
    out = {}
    for k, v in state.items():
        if k == "visual_model.shared_image_embedding.positional_embedding":
            continue
        if k.startswith("language_model.lm_head."):
            nk = k[len("language_model."):]
        elif k.startswith("language_model.model."):
            nk = "model." + k[len("language_model.model."):]
        elif k.startswith("vision_tower."):  # transformers 4.x CLIPVisionModel naming: vision_model.…
            rest = k[len("vision_tower."):]
            rest = rest if rest.startswith("vision_model.") else f"vision_model.{rest}"
            nk = "model.vision_tower.vision_tower." + rest
        elif k.startswith("mm_projector."):
            nk = "model." + k
        elif k.startswith("text_hidden_fcs."):
            nk = "model.text_hidden_fcs.0." + k[len("text_hidden_fcs."):]
        else:
            nk = "model.visual_model." + _sa_name(k[len("visual_model."):])
        out[nk] = v.clone()
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny random model (all weights random) and its tokenizer."""
    tok = tiny_tokenizer()
    torch.manual_seed(3)
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval(), tok


def _write_folder(folder: Path, model, tok, released: dict, fmt: str) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    llm = dict(model.arch["llm"])
    (folder / "config.json").write_text(json.dumps({**llm, "model_type": "llava", "mm_vision_select_layer": -2,
                                                    "mm_vision_tower": "openai/clip-vit-large-patch14"}))
    tok.save_pretrained(str(folder))
    keys = sorted(released)
    shards = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    suffix = "bin" if fmt == "bin" else "safetensors"
    stem = "pytorch_model" if fmt == "bin" else "model"
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.{suffix}"
        tensors = {k: released[k].contiguous() for k in part}
        torch.save(tensors, folder / name) if fmt == "bin" else save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(part, name))
    (folder / f"{stem}.{suffix}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _outputs(model, tok):
    rng = np.random.default_rng(0)
    clip = torch.tensor(rng.normal(size=(1, 3, 32, 32)), dtype=torch.float32)
    sam = torch.tensor(rng.normal(size=(1, 3, 64, 64)), dtype=torch.float32)
    enc = [encode(tok, "Segment the edema.", "[SEG] There is no edema.", 200)]
    embeds, attn, _, _ = model.build_inputs(enc, model.image_features(clip))
    with torch.no_grad():
        logits = model.language_model(inputs_embeds=embeds, attention_mask=attn).logits
    return logits, model.teacher_forced_low_res(enc, clip, sam)


def test_released_layout_uses_the_real_key_names(source):
    model, _ = source
    released = to_released(model.state_dict())
    missing = [k for k in KNOWN_RELEASED_KEYS if k not in released]
    assert not missing
    hf_only = ("layer_norm", "proj_in", "proj_out", "upscale_", ".mask_embed.", ".point_embed.", "vision_encoder",
               "shared_embedding", "patch_embed.projection")
    assert not [k for k in released if k.startswith("model.visual_model.") and any(h in k for h in hf_only)]
    # the converter's table inverts the layout exactly (CLIP's vision_model. level depends on the transformers version)
    def norm(k):
        return k.replace("vision_tower.vision_model.", "vision_tower.")

    ours = {norm(k) for k in model.state_dict() if k != "visual_model.shared_image_embedding.positional_embedding"}
    assert {norm(map_key(k)) for k in released} == ours


def test_convert_sharded_bin_with_index(source, tmp_path):
    model, tok = source
    released = to_released(model.state_dict())
    layer0 = "model.layers.0.self_attn.rotary_emb.inv_freq"
    released[layer0] = torch.ones(4)  # a non-persistent buffer stored by old checkpoints: ignored
    folder = _write_folder(tmp_path / "LISA-tiny", model, tok, released, "bin")
    clip_dir = tmp_path / "clip"  # the tower is in the source; the folder only gives the (tiny) CLIP config
    model.vision_tower.config.save_pretrained(str(clip_dir))
    out = convert_released(folder, tmp_path / "converted", clip=clip_dir)
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["model"] == "lisa" and info["conversion"]["ignored"] == [layer0]
    assert info["conversion"]["left_initialised"] == []
    from cxrground.models.lisa.checkpoint import load_checkpoint

    converted, ctok, _ = load_checkpoint(out)
    theirs = converted.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(theirs[key], value), key
    for a, b in zip(_outputs(model, tok), _outputs(converted, ctok), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    from cxrground.models.base import load_model

    assert load_model(out).name == "lisa"


def test_convert_safetensors_with_separate_clip_and_sam(source, tmp_path):
    model, tok = source
    released = to_released(model.state_dict())
    tower = {k: released.pop(k) for k in list(released) if k.startswith("model.vision_tower.")}
    sam = {k[len(_VM):]: released.pop(k) for k in list(released) if k.startswith(_VM)}
    assert tower and sam
    folder = _write_folder(tmp_path / "ROSALIA-tiny", model, tok, released, "safetensors")
    clip_dir = tmp_path / "clip"
    model.vision_tower.save_pretrained(str(clip_dir))
    sam_pth = tmp_path / "sam_tiny.pth"
    torch.save({**sam, "pixel_mean": torch.zeros(3, 1, 1)}, sam_pth)
    with pytest.raises(ConfigError, match="SAM"):
        load_released_model(folder, clip=clip_dir)
    with pytest.raises(ConfigError, match="CLIP"):
        load_released_model(folder, sam=sam_pth)
    converted, _, report = load_released_model(folder, sam=sam_pth, clip=clip_dir)
    assert set(report["filled_from"]) == {"visual_model", "vision_tower"}
    theirs = converted.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(theirs[key], value), key
    for a, b in zip(_outputs(model, tok), _outputs(converted, tok), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_unmapped_and_missing_keys_are_reported(source, tmp_path):
    model, tok = source
    released = to_released(model.state_dict())
    released["model.some_new_head.weight"] = torch.zeros(2)
    folder = _write_folder(tmp_path / "extra", model, tok, released, "bin")
    clip_dir = tmp_path / "clip"
    model.vision_tower.config.save_pretrained(str(clip_dir))
    with pytest.raises(InputError, match="some_new_head"):
        load_released_model(folder, clip=clip_dir)
    released = to_released(model.state_dict())
    fcs = {k: released.pop(k) for k in list(released) if k.startswith("model.text_hidden_fcs.")}
    assert len(fcs) == 4
    folder = _write_folder(tmp_path / "llava-like", model, tok, released, "bin")
    with pytest.raises(InputError, match="text_hidden_fcs"):
        load_released_model(folder, clip=clip_dir)
    _, _, report = load_released_model(folder, clip=clip_dir, allow_missing=["text_hidden_fcs"])
    assert sorted(report["left_initialised"]) == ["text_hidden_fcs.0.bias", "text_hidden_fcs.0.weight",
                                                  "text_hidden_fcs.2.bias", "text_hidden_fcs.2.weight"]


def test_convert_lisa_cli(source, tmp_path):
    from click.testing import CliRunner

    import cxrground.cli.ils_model_cmds  # noqa: F401  (attaches the command to the ils group)
    from cxrground.cli import main

    model, tok = source
    folder = _write_folder(tmp_path / "src", model, tok, to_released(model.state_dict()), "safetensors")
    model.vision_tower.config.save_pretrained(str(tmp_path / "clip"))
    result = CliRunner().invoke(main, ["ils", "convert-lisa", "--source", str(folder), "--out", str(tmp_path / "o"),
                                       "--clip", str(tmp_path / "clip")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "model.safetensors").is_file()
    bad = CliRunner().invoke(main, ["ils", "convert-lisa", "--source", str(tmp_path / "clip_missing_dir"),
                                    "--out", str(tmp_path / "o2")])
    assert bad.exit_code != 0
