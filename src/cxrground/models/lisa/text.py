"""Tokenisation for the LISA model: the LLaVA v1 conversation (ILS.md §4.1), ``[SEG]`` lookup, answer labels.

- ``<image>`` is never a vocabulary lookup: the text is split at :data:`~cxrground.vocab.ils_templates.IMAGE_TOKEN`
  and the chunks are tokenised separately around the placeholder id :data:`IMAGE_PLACEHOLDER` (as LLaVA's
  ``tokenizer_image_token``); the model replaces the placeholder by the CLIP patch embeddings.
- Same ids as the reference training (ILS.md §4.1, §17.1): the reference adds ``<im_start>``, ``<im_end>`` and
  ``[SEG]`` with the transformers < 4.34 default that strips the whitespace on both sides of an added token, and
  its LLaMA tokenizer encodes each text piece between added tokens on its own (SentencePiece dummy prefix per
  piece). :func:`token_ids` reproduces that with any installed transformers: the text is split at the added and
  special tokens (:data:`STRIPPED_TOKENS`, ``<image>``, ``</s>``), whitespace next to a stripped token is removed
  (``… ASSISTANT: [SEG] There …`` → ``… ASSISTANT:`` · ``[SEG]`` · ``There …``; ``<im_end>\n`` loses its newline),
  each piece is tokenised without special tokens and the added/special ids are inserted from the vocabulary.
- ``[SEG]`` is resolved with ``convert_tokens_to_ids`` and must be a single, known id (ILS.md §18.9).
- Labels: only the assistant answer (including ``[SEG]`` and ``</s>``) is supervised; the answer starts
  after the longest common prefix of the tokenised prompt (``… ASSISTANT:``) and the training sequence.
- Text is truncated to ``max_length − (n_image_tokens − 1)`` tokens (512 − 255 = 257 with the defaults).

:func:`tiny_tokenizer` builds the test/smoke tokenizer locally: a byte-level BPE trained on the vocabulary
templates, ``<s>``/``</s>``/``<unk>`` (pad = unk), ``<im_start>``/``<im_end>``/``<image>`` special and
``[SEG]`` an ordinary added token, as in the released tokenizer. :func:`load_tokenizer` also reads a released
folder whose tokenizer is only ``tokenizer.model`` (the slow LLaMA SentencePiece tokenizer; needs
``sentencepiece``, in the ``vlm`` extra).
"""

from __future__ import annotations

import importlib.util
import re
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
    "STRIPPED_TOKENS",
    "Encoded",
    "answer_text",
    "encode",
    "load_tokenizer",
    "seg_token_id",
    "tiny_tokenizer",
    "token_ids",
]

#: Id standing for ``<image>`` in token sequences before the image embeddings are spliced in (LLaVA's value).
IMAGE_PLACEHOLDER: Final[int] = -200
#: The assistant role marker that ends the inference prompt (``ASSISTANT:``).
ASSISTANT_ROLE: Final[str] = T.LLAVA_PROMPT.rsplit(" ", 1)[-1]
#: Label value ignored by the text loss.
IGNORE_INDEX: Final[int] = -100
#: Added tokens whose neighbouring whitespace the reference tokenizer strips (see the module docstring).
STRIPPED_TOKENS: Final[tuple[str, ...]] = (T.IM_START, T.IM_END, T.SEG_TOKEN)
#: Splits a conversation at the tokens that are never tokenised as text (kept as separate list items).
_SPLIT: Final[re.Pattern[str]] = re.compile(
    "(" + "|".join(re.escape(t) for t in (T.IMAGE_TOKEN, *STRIPPED_TOKENS, T.EOS)) + ")")
#: File of a SentencePiece (slow LLaMA) tokenizer and of a converted fast tokenizer.
SPM_FILE: Final[str] = "tokenizer.model"
FAST_FILE: Final[str] = "tokenizer.json"


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


def _vocab_id(tokenizer: Any, token: str) -> int:
    """The id of an added or special token through the vocabulary; a :class:`ConfigError` when it is unknown."""
    if token == T.EOS and tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ConfigError(f"the tokenizer has no {token} token")
    return int(tid)


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` the reference's way (module docstring): BOS first, ``<image>`` as :data:`IMAGE_PLACEHOLDER`."""
    ids = [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
    parts = _SPLIT.split(text)
    for i, part in enumerate(parts):
        if i % 2:
            ids.append(IMAGE_PLACEHOLDER if part == T.IMAGE_TOKEN else _vocab_id(tokenizer, part))
            continue
        if i > 0 and parts[i - 1] in STRIPPED_TOKENS:
            part = part.lstrip()
        if i + 1 < len(parts) and parts[i + 1] in STRIPPED_TOKENS:
            part = part.rstrip()
        if part:
            ids.extend(int(t) for t in tokenizer(part, add_special_tokens=False).input_ids)
    return ids


def encode(tokenizer: Any, instruction: str, answer: str | None, max_text_tokens: int) -> Encoded:
    """Tokenise the LLaVA v1 prompt (``answer`` None) or training sequence, labels on the answer only."""
    prompt = token_ids(tokenizer, T.llava_prompt(instruction))
    if answer is None:
        return Encoded(prompt[:max_text_tokens], [IGNORE_INDEX] * min(len(prompt), max_text_tokens))
    full = token_ids(tokenizer, T.llava_prompt(instruction, answer))
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
    # the reference strips the space after [SEG] when tokenising; decoders differ in putting it back
    return re.sub(re.escape(T.SEG_TOKEN) + r"(?=\S)", T.SEG_TOKEN + " ", text).strip()


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer from a local folder (never downloaded), right padding, pad = unk when it has no pad.

    A folder with only ``tokenizer.model`` (no ``tokenizer.json``) is the slow LLaMA SentencePiece tokenizer of
    the released checkpoints: it is read with ``LlamaTokenizer`` and needs ``sentencepiece``.
    """
    folder = Path(path)
    spm_only = (folder / SPM_FILE).is_file() and not (folder / FAST_FILE).is_file()
    if spm_only and importlib.util.find_spec("sentencepiece") is None:
        raise ConfigError(f"{folder / SPM_FILE} is a SentencePiece tokenizer: install sentencepiece "
                          "(pip install sentencepiece, or the 'vlm' extra of cxrground)")
    try:
        if spm_only:
            from transformers import LlamaTokenizer

            tok = LlamaTokenizer.from_pretrained(str(folder), local_files_only=True)
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {folder}: {exc}") from exc
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
