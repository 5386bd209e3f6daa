"""Released checkpoints (issue 12 items 1-3): the SentencePiece-only tokenizer, the reference's token ids, the dtype.

The tokenizer is a tiny SentencePiece model trained offline inside the test on the vocabulary templates, saved in
the released LLaMA layout (``tokenizer.model`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` +
``added_tokens.json``, no ``tokenizer.json``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from cxrground.errors import ConfigError  # noqa: E402
from cxrground.models.lisa.convert import convert_released, source_dtype  # noqa: E402
from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch  # noqa: E402
from cxrground.models.lisa.text import (  # noqa: E402
    IGNORE_INDEX,
    IMAGE_PLACEHOLDER,
    _corpus,
    encode,
    load_tokenizer,
    seg_token_id,
)
from cxrground.vocab import ils_templates as T  # noqa: E402
from test_models_lisa_convert import _outputs, _write_folder, to_released  # noqa: E402

SPM_VOCAB = 420
ADDED = {T.SEG_TOKEN: SPM_VOCAB, T.IM_START: SPM_VOCAB + 1, T.IM_END: SPM_VOCAB + 2}

#: One conversation per answer shape (basic +/-, global + with location, cardiomegaly, lesion inference +/-).
PAIRS = [
    ("Segment the edema in the right lung.", "[SEG]"),
    ("Segment the atelectasis in the left lung base.", "[SEG] There is no atelectasis in the left lung base."),
    ("Segment the opacity.", "[SEG] It is located in the right lung base and left lung base."),
    ("Segment the cardiomegaly.", "[SEG]"),
    ("Segment the opacity in the right lung and predict its type.", "[SEG] It possibly reflects pneumonia."),
    ("Segment the opacity in the left upper lung.", "[SEG] There is no opacity in the left upper lung."),
]


def _train_spm() -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus() * 2), model_writer=buf, vocab_size=SPM_VOCAB, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True, character_coverage=1.0,
        add_dummy_prefix=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
        split_digits=True, minloglevel=2, num_threads=1)
    return buf.getvalue()


def write_spm_tokenizer(folder: Path, model_proto: bytes) -> Path:
    """The released LLaMA tokenizer files: ``tokenizer.model`` (slow) + configs + added tokens, no tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model_proto)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 512, "padding_side": "right", "legacy": True, "add_bos_token": True,
        "add_eos_token": False}))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}))
    (folder / "added_tokens.json").write_text(json.dumps(ADDED))
    return folder


@pytest.fixture(scope="module")
def spm_proto() -> bytes:
    return _train_spm()


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory, spm_proto) -> Path:
    return write_spm_tokenizer(tmp_path_factory.mktemp("spm") / "tok", spm_proto)


def reference_ids(sp, instruction: str, answer: str | None) -> list[int]:
    """The reference's sequence, built by hand: LLaVA v1 with ``<im_start><image><im_end>``, each text piece between
    added tokens stripped and SentencePiece-encoded on its own (pre-4.34 transformers + ``tokenizer_image_token``)."""
    ids = [sp.bos_id(), *sp.encode(f"{T.LLAVA_SYSTEM} USER:"), ADDED[T.IM_START], IMAGE_PLACEHOLDER,
           ADDED[T.IM_END], *sp.encode(f"{instruction} ASSISTANT:")]
    if answer is None:
        return ids
    assert answer.startswith(T.SEG_TOKEN)
    rest = answer[len(T.SEG_TOKEN):].strip()
    return [*ids, ADDED[T.SEG_TOKEN], *(sp.encode(rest) if rest else []), sp.eos_id()]


# --- item 1: the SentencePiece-only tokenizer ------------------------------------------------------
def test_sentencepiece_only_tokenizer_loads(spm_dir):
    assert not (spm_dir / "tokenizer.json").exists()
    tok = load_tokenizer(spm_dir)
    assert seg_token_id(tok) == ADDED[T.SEG_TOKEN]
    assert tok.pad_token == tok.unk_token and tok.padding_side == "right"
    assert tok.convert_tokens_to_ids(T.IM_END) == ADDED[T.IM_END]


def test_missing_sentencepiece_is_a_clear_error(spm_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tokenizer\.model.*sentencepiece"):
        load_tokenizer(spm_dir)


# --- item 2: the reference's token ids ------------------------------------------------------------
@pytest.mark.parametrize(("instruction", "answer"), PAIRS)
def test_conversation_ids_match_the_reference(spm_dir, spm_proto, instruction, answer):
    sp = spm.SentencePieceProcessor(model_proto=spm_proto)
    tok = load_tokenizer(spm_dir)
    enc = encode(tok, instruction, answer, 10_000)
    assert enc.input_ids == reference_ids(sp, instruction, answer)
    assert encode(tok, instruction, None, 10_000).input_ids == reference_ids(sp, instruction, None)
    # labels: exactly the answer ([SEG] … </s>), as the reference's round/instruction lengths give
    n_prompt = len(reference_ids(sp, instruction, None))
    assert enc.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert enc.labels[n_prompt:] == enc.input_ids[n_prompt:]
    assert enc.input_ids[n_prompt] == ADDED[T.SEG_TOKEN]


def test_whitespace_next_to_added_tokens_is_stripped(spm_dir):
    tok = load_tokenizer(spm_dir)
    enc = encode(tok, *PAIRS[1], 10_000).input_ids
    seg = enc.index(ADDED[T.SEG_TOKEN])
    space = tok.convert_tokens_to_ids("▁")
    # no lone '▁' before [SEG] or <im_start>, and no newline piece after <im_end>
    assert enc[seg - 1] != space and enc[enc.index(ADDED[T.IM_START]) - 1] != space
    after_end = tok.convert_ids_to_tokens(enc[enc.index(ADDED[T.IM_END]) + 1])
    assert after_end.startswith("▁Seg") or after_end == "▁S"


# --- items 1 + 3: converting a bf16 release with a SentencePiece tokenizer --------------------------
@pytest.fixture(scope="module")
def bf16_release(tmp_path_factory, spm_dir):
    """A tiny random model saved in the released layout in bfloat16, with the SentencePiece tokenizer."""
    tok = load_tokenizer(spm_dir)
    torch.manual_seed(5)
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model = model.to(torch.bfloat16).eval()
    root = tmp_path_factory.mktemp("release")
    folder = _write_folder(root / "ROSALIA-tiny", model, tok, to_released(model.state_dict()), "safetensors")
    for name in ("tokenizer.json",):  # the release ships only the slow tokenizer
        (folder / name).unlink(missing_ok=True)
    write_spm_tokenizer(folder, (spm_dir / "tokenizer.model").read_bytes())
    clip_dir = root / "clip"
    model.vision_tower.config.save_pretrained(str(clip_dir))
    return model, folder, clip_dir


def _weights_dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        return {str(fh.get_slice(k).get_dtype()) for k in fh.keys()}  # noqa: SIM118


def test_convert_keeps_the_source_dtype_and_dtype_overrides(bf16_release, spm_dir, spm_proto, tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.models.lisa.checkpoint import load_checkpoint

    model, folder, clip_dir = bf16_release
    assert source_dtype(model.state_dict()) == torch.bfloat16
    out = convert_released(folder, tmp_path / "bf16", clip=clip_dir)
    assert _weights_dtypes(out) == {"BF16"}
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["conversion"]["dtype"] == "bfloat16"
    res = CliRunner().invoke(main, ["ils", "convert-lisa", "--source", str(folder), "--out", str(tmp_path / "fp32"),
                                    "--clip", str(clip_dir), "--dtype", "float32"])
    assert res.exit_code == 0, res.output
    assert _weights_dtypes(tmp_path / "fp32") == {"F32"}
    size16 = (out / "model.safetensors").stat().st_size
    size32 = (tmp_path / "fp32" / "model.safetensors").stat().st_size
    assert 0.45 < size16 / size32 < 0.55
    # the converted checkpoint reproduces the bf16 source exactly and encodes the reference's ids
    converted, ctok, _ = load_checkpoint(out)
    assert all(v.dtype == torch.float32 for v in converted.state_dict().values() if v.is_floating_point())
    src = {k: v.float() for k, v in model.state_dict().items()}
    for key, value in converted.state_dict().items():
        assert torch.equal(value, src[key]), key
    sp = spm.SentencePieceProcessor(model_proto=spm_proto)
    for instruction, answer in PAIRS:
        assert encode(ctok, instruction, answer, 10_000).input_ids == reference_ids(sp, instruction, answer)
    tok = load_tokenizer(spm_dir)
    ref = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))  # fp32 buffers (rotary), bf16 weights
    ref.load_state_dict(src)
    for a, b in zip(_outputs(ref.eval(), tok), _outputs(converted, ctok), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_generated_answer_text_puts_the_space_after_seg_back(spm_dir):
    from cxrground.models.lisa.text import answer_text

    tok = load_tokenizer(spm_dir)
    sp_ids = encode(tok, *PAIRS[1], 10_000).input_ids
    answer_ids = sp_ids[sp_ids.index(ADDED[T.SEG_TOKEN]):]
    assert answer_text(tok, answer_ids) == PAIRS[1][1]
    assert np.array_equal(np.array(answer_ids[-1:]), np.array([tok.eos_token_id]))


# --- the release's slow tokenizer survives conversion and export -----------------------------------
def test_convert_and_export_keep_the_release_slow_tokenizer(bf16_release, spm_proto, tmp_path):
    """transformers >= 5 writes no tokenizer.model or added_tokens.json, and the reference (transformers 4.31,
    use_fast=False) reads nothing else: the checkpoint keeps the release's files and the export writes them back."""
    from cxrground.models.lisa.convert import RELEASE_TOKENIZER_FILES
    from cxrground.models.lisa.export import export_released

    _, folder, clip_dir = bf16_release
    ckpt = convert_released(folder, tmp_path / "ckpt", clip=clip_dir)
    notes: list[str] = []
    out = export_released(ckpt, tmp_path / "exported", log=notes.append)
    for name in RELEASE_TOKENIZER_FILES:
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name
        assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    assert not [n for n in notes if "tokenizer" in n]
    sp = spm.SentencePieceProcessor(model_proto=spm_proto)
    for instruction, answer in PAIRS:  # the cxrground reading of the exported folder is unchanged
        assert encode(load_tokenizer(out), instruction, answer, 10_000).input_ids == reference_ids(sp, instruction,
                                                                                                   answer)


def test_export_takes_the_slow_tokenizer_from_the_release_it_came_from(bf16_release, tmp_path):
    """A checkpoint without the release's slow files (converted by an older version, or trained) gets them from its
    base_model when that folder is here and encodes the same ids; a note names it."""
    from cxrground.models.lisa.convert import RELEASE_TOKENIZER_FILES
    from cxrground.models.lisa.export import export_released

    _, folder, clip_dir = bf16_release
    ckpt = convert_released(folder, tmp_path / "ckpt", clip=clip_dir)
    for name in RELEASE_TOKENIZER_FILES:
        (ckpt / name).unlink()
    notes: list[str] = []
    out = export_released(ckpt, tmp_path / "exported", log=notes.append)
    assert (out / "tokenizer.model").read_bytes() == (folder / "tokenizer.model").read_bytes()
    assert (out / "added_tokens.json").is_file()
    assert any(str(folder) in n and "release" in n for n in notes)
    moved = tmp_path / "moved"  # the release is no longer here: the note says what the reference lacks
    folder.rename(moved)
    try:
        notes.clear()
        export_released(ckpt, tmp_path / "exported2", log=notes.append)
        assert not (tmp_path / "exported2" / "tokenizer.model").exists()
        assert any("no tokenizer.model" in n and "--tokenizer" in n for n in notes)
    finally:
        moved.rename(folder)
