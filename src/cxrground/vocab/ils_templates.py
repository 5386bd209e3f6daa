"""ILS instruction and answer templates (ILS.md §4, paper Table 2), verbatim.

Placeholders use ``str.format`` names: ``{target}``, ``{location}``, ``{lesion}``. The render
functions here only fill templates; the composition rules (tentative -> opacity, which pairs
exist) live in :mod:`cxrground.ils`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import join_ils, split_ils

InstructionType = Literal["basic", "global", "lesion_inference"]
INSTRUCTION_TYPES: Final[tuple[str, str, str]] = ("basic", "global", "lesion_inference")
Certainty = Literal["definitive", "tentative"]

SEG_TOKEN: Final[str] = "[SEG]"

BASIC_INSTRUCTION: Final[str] = "Segment the {target} in the {location}."
BASIC_POSITIVE: Final[str] = "[SEG]"
BASIC_NEGATIVE: Final[str] = "[SEG] There is no {target} in the {location}."

GLOBAL_INSTRUCTION: Final[str] = "Segment the {target}."
GLOBAL_POSITIVE: Final[str] = "[SEG] It is located in the {location}."
GLOBAL_POSITIVE_CARDIOMEGALY: Final[str] = "[SEG]"
GLOBAL_NEGATIVE: Final[str] = "[SEG] There is no {target}."

LESION_INFERENCE_INSTRUCTION: Final[str] = "Segment the opacity in the {location} and predict its type."
LESION_INFERENCE_DEFINITIVE: Final[str] = "[SEG] It is highly suggestive of {lesion}."
LESION_INFERENCE_TENTATIVE: Final[str] = "[SEG] It possibly reflects {lesion}."
LESION_INFERENCE_NEGATIVE: Final[str] = "[SEG] There is no opacity in the {location}."

#: The word that replaces a tentative finding's lesion in instructions, and the LI-negative target.
TENTATIVE_WORD: Final[str] = "opacity"

#: LLaVA v1 conversation wrapping used by the reference model (ILS.md §4.1).
LLAVA_SYSTEM: Final[str] = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
IMAGE_TOKEN: Final[str] = "<image>"
IM_START: Final[str] = "<im_start>"
IM_END: Final[str] = "<im_end>"
EOS: Final[str] = "</s>"
LLAVA_PROMPT: Final[str] = "{system} USER: <im_start><image><im_end>\n{instruction} ASSISTANT:"
LLAVA_TRAINING: Final[str] = "{system} USER: <im_start><image><im_end>\n{instruction} ASSISTANT: {answer}</s>"

#: RadEdit edit prompt used to synthesise a "normal" image (ILS.md §8).
RADEDIT_PROMPT: Final[str] = "No acute cardiopulmonary process"


def instruction(kind: str, target: str, location: Sequence[str] | None = None) -> str:
    """Render the instruction of a pair of type ``kind`` (``target`` as it should appear in the text)."""
    if kind == "basic":
        return BASIC_INSTRUCTION.format(target=target, location=_loc(location))
    if kind == "global":
        return GLOBAL_INSTRUCTION.format(target=target)
    if kind == "lesion_inference":
        return LESION_INFERENCE_INSTRUCTION.format(location=_loc(location))
    raise ValueError(f"unknown instruction type {kind!r}")


def positive_answer(
    kind: str,
    target: str,
    location: Sequence[str] | None = None,
    certainty: str = "definitive",
) -> str:
    """Render the answer of a positive pair; ``target`` is the original lesion."""
    if kind == "basic":
        return BASIC_POSITIVE
    if kind == "global":
        if target in HEART_MASK_LESIONS:  # the location is the heart: no location sentence
            return GLOBAL_POSITIVE_CARDIOMEGALY
        return GLOBAL_POSITIVE.format(location=_loc(location))
    if kind == "lesion_inference":
        if certainty == "tentative":
            return LESION_INFERENCE_TENTATIVE.format(lesion=target)
        if certainty == "definitive":
            return LESION_INFERENCE_DEFINITIVE.format(lesion=target)
        raise ValueError(f"certainty must be 'definitive' or 'tentative', got {certainty!r}")
    raise ValueError(f"unknown instruction type {kind!r}")


def negative_answer(kind: str, target: str, location: Sequence[str] | None = None) -> str:
    """Render the answer of a negative pair (``target`` as named in the instruction)."""
    if kind == "basic":
        return BASIC_NEGATIVE.format(target=target, location=_loc(location))
    if kind == "global":
        return GLOBAL_NEGATIVE.format(target=target)
    if kind == "lesion_inference":
        return LESION_INFERENCE_NEGATIVE.format(location=_loc(location))
    raise ValueError(f"unknown instruction type {kind!r}")


def llava_prompt(instruction_text: str, answer: str | None = None) -> str:
    """The LLaVA v1 sequence: inference prompt, or the training sequence when ``answer`` is given."""
    if answer is None:
        return LLAVA_PROMPT.format(system=LLAVA_SYSTEM, instruction=instruction_text)
    return LLAVA_TRAINING.format(system=LLAVA_SYSTEM, instruction=instruction_text, answer=answer)


def _loc(location: Sequence[str] | None) -> str:
    if not location:
        raise ValueError("this template needs a location")
    return join_ils(location)


@dataclass(frozen=True)
class ParsedInstruction:
    """An instruction read back into its template slots.

    ``kind`` is the JSON ``type``; ``target`` is the word as written in the text (``opacity`` for
    lesion-inference and tentative instructions); ``locations`` are the labels in text order (empty for
    ``global``).
    """

    kind: str
    target: str
    locations: list[str] = field(default_factory=list)


def _instruction_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    body = "".join(f"(?P<{p}>.+?)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.compile(body + "$")


# lesion inference first: its text also has the basic form "Segment the X in the Y."
_INSTRUCTION_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("lesion_inference", _instruction_regex(LESION_INFERENCE_INSTRUCTION)),
    ("basic", _instruction_regex(BASIC_INSTRUCTION)),
    ("global", _instruction_regex(GLOBAL_INSTRUCTION)),
)


def parse_instruction(text: str) -> ParsedInstruction | None:
    """Inverse of :func:`instruction`: kind, target as written and location labels; None if no template fits.

    Matching is exact (case and punctuation) after stripping surrounding whitespace, so
    ``instruction(p.kind, p.target, p.locations or None) == text`` for every parsed ``p``.
    """
    text = text.strip()
    for kind, pattern in _INSTRUCTION_PATTERNS:
        m = pattern.match(text)
        if m is None:
            continue
        slots = m.groupdict()
        target = slots.get("target", TENTATIVE_WORD)
        locations = split_ils(slots["location"]) if "location" in slots else []
        if " in the " in target or (kind != "global" and not locations):
            continue
        return ParsedInstruction(kind, target, locations)
    return None
