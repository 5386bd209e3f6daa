"""Tokenisation for the LISA model: the LLaVA v1 conversation (ILS.md §4.1), ``[SEG]`` lookup, answer labels.

- ``<image>`` is never a vocabulary lookup: the text is split at :data:`~cxrground.vocab.ils_templates.IMAGE_TOKEN`
  and the chunks are tokenised separately around the placeholder id :data:`IMAGE_PLACEHOLDER` (as LLaVA's
  ``tokenizer_image_token``); the model replaces the placeholder by the CLIP patch embeddings.
- ``[SEG]`` is resolved with ``convert_tokens_to_ids`` and must be a single, known id (ILS.md §18.9).
- Labels: only the assistant answer (including ``[SEG]`` and ``</s>``) is supervised; the answer starts
  after the longest common prefix of the tokenised prompt (``… ASSISTANT:``) and the training sequence.
- Text is truncated to ``max_length − (n_image_tokens − 1)`` tokens (512 − 255 = 257 with the defaults).

:func:`tiny_tokenizer` builds the test/smoke tokenizer locally: a byte-level BPE trained on the vocabulary
templates, ``<s>``/``</s>``/``<unk>`` (pad = unk), ``<im_start>``/``<im_end>``/``<image>`` special and
``[SEG]`` an ordinary added token, as in the released tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.vocab import ils_templates as T
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = [
    "IGNORE_INDEX",
    "IMAGE_PLACEHOLDER",
    "Encoded",
    "answer_text",
    "encode",
    "load_tokenizer",
    "seg_token_id",
    "tiny_tokenizer",
]

#: Id standing for ``<image>`` in token sequences before the image embeddings are spliced in (LLaVA's value).
IMAGE_PLACEHOLDER: Final[int] = -200
#: The assistant role marker that ends the inference prompt (``ASSISTANT:``).
ASSISTANT_ROLE: Final[str] = T.LLAVA_PROMPT.rsplit(" ", 1)[-1]
#: Label value ignored by the text loss.
IGNORE_INDEX: Final[int] = -100


@dataclass(frozen=True)
class Encoded:
    """Token ids of one conversation (``<image>`` = :data:`IMAGE_PLACEHOLDER`) and their labels."""

    input_ids: list[int]
    labels: list[int]


def seg_token_id(tokenizer: Any) -> int:
    """The id of ``[SEG]`` through the vocabulary; a :class:`ConfigError` when it is unknown or not single."""
    ids = tokenizer.convert_tokens_to_ids([T.SEG_TOKEN])
    if len(ids) != 1 or ids[0] is None or ids[0] == tokenizer.unk_token_id:
        raise ConfigError(f"the tokenizer has no single {T.SEG_TOKEN} token (got {ids})")
    return int(ids[0])


def _tokenize(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` with BOS first and ``<image>`` as :data:`IMAGE_PLACEHOLDER`."""
    ids = [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
    for i, chunk in enumerate(text.split(T.IMAGE_TOKEN)):
        if i:
            ids.append(IMAGE_PLACEHOLDER)
        if chunk:
            ids.extend(int(t) for t in tokenizer(chunk, add_special_tokens=False).input_ids)
    return ids


def encode(tokenizer: Any, instruction: str, answer: str | None, max_text_tokens: int) -> Encoded:
    """Tokenise the LLaVA v1 prompt (``answer`` None) or training sequence, labels on the answer only."""
    prompt = _tokenize(tokenizer, T.llava_prompt(instruction))
    if answer is None:
        return Encoded(prompt[:max_text_tokens], [IGNORE_INDEX] * min(len(prompt), max_text_tokens))
    full = _tokenize(tokenizer, T.llava_prompt(instruction, answer))
    start = 0
    while start < min(len(prompt), len(full)) and prompt[start] == full[start]:
        start += 1
    labels = [IGNORE_INDEX] * start + full[start:]
    return Encoded(full[:max_text_tokens], labels[:max_text_tokens])


def answer_text(tokenizer: Any, generated_ids: list[int]) -> str:
    """Decoded assistant answer: text after the last ``ASSISTANT:`` (when present) and before ``</s>``."""
    text = tokenizer.decode(generated_ids, skip_special_tokens=False)
    text = text.rsplit(ASSISTANT_ROLE, 1)[-1]
    eos = tokenizer.eos_token or T.EOS
    text = text.split(eos, 1)[0]
    for special in (T.IM_START, T.IM_END, T.IMAGE_TOKEN, tokenizer.pad_token or "", tokenizer.bos_token or ""):
        if special:
            text = text.replace(special, "")
    return text.strip()


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer from a local folder (never downloaded), right padding, pad = unk when it has no pad."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {path}: {exc}") from exc
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token
    seg_token_id(tok)
    return tok


def _corpus() -> list[str]:
    """Template sentences rendered over the whole vocabulary (for the tiny BPE)."""
    lines = [T.llava_prompt("x", "y")]
    for target in (*LESIONS, T.TENTATIVE_WORD):
        for loc in ILS_LOCATION_LABELS:
            lines += [T.BASIC_INSTRUCTION.format(target=target, location=loc),
                      T.BASIC_NEGATIVE.format(target=target, location=loc),
                      T.GLOBAL_POSITIVE.format(location=loc),
                      T.LESION_INFERENCE_INSTRUCTION.format(location=loc),
                      T.LESION_INFERENCE_DEFINITIVE.format(lesion=target),
                      T.LESION_INFERENCE_TENTATIVE.format(lesion=target)]
        lines += [T.GLOBAL_INSTRUCTION.format(target=target), T.GLOBAL_NEGATIVE.format(target=target)]
    return lines


def tiny_tokenizer(vocab_size: int = 400) -> Any:
    """A small byte-level BPE tokenizer in the released tokenizer's shape (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", T.EOS, T.IM_START, T.IM_END, T.IMAGE_TOKEN]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token=T.EOS, unk_token="<unk>",
                                  pad_token="<unk>", extra_special_tokens=[T.IM_START, T.IM_END, T.IMAGE_TOKEN],
                                  model_max_length=512, padding_side="right")
    tok.add_tokens([T.SEG_TOKEN])
    return tok
