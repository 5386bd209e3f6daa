"""CheXpercept question, option, prompt and oracle texts (CHEXPERCEPT.md §2-§4, §13), verbatim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import PERCEPT_ZONE_DISPLAY, join_percept
from cxrground.vocab.traits import groups

_GROUPS = groups()

# --- paths ---------------------------------------------------------------------------------------
PATH_REVISION_REQUIRED: Final[str] = "revision_required"
PATH_REVISION_FREE: Final[str] = "revision_free"
PATH_LESION_FREE: Final[str] = "lesion_free"
PATHS: Final[tuple[str, str, str]] = (PATH_REVISION_REQUIRED, PATH_REVISION_FREE, PATH_LESION_FREE)
PATH_ABBREVIATIONS: Final[dict[str, str]] = {
    PATH_REVISION_REQUIRED: "RR",
    PATH_REVISION_FREE: "RF",
    PATH_LESION_FREE: "LF",
}

# --- question layout -----------------------------------------------------------------------------
QUESTION_LAYOUT: Final[str] = "{stem}\n\nOptions:\n{options}"
OPTION_LINE: Final[str] = "({i}) {text}"
YES_NO: Final[tuple[str, str]] = ("Yes", "No")

# --- stage 1: detection --------------------------------------------------------------------------
DETECTION_PLAIN: Final[str] = "Is any {lesion} visible in the image?"
DETECTION_SUGGESTIVE: Final[str] = "Is any finding suggestive of {lesion} visible in the image?"
DETECTION_PLAIN_LESIONS: Final[tuple[str, ...]] = _GROUPS.plain_detection  # opacity, consolidation

# --- stage 2: contour evaluation -----------------------------------------------------------------
CONTOUR_EVAL: Final[str] = (
    "The image shows a chest X-ray with a predicted mask for the {lesion} (shown in the overlay). "
    "Is any major revision needed?"
)
HEART_NOTE: Final[str] = " Note that lesions overlapping with the heart do not need to be considered."

# --- stage 3: contour revision -------------------------------------------------------------------
INITIAL_CONTEXT: Final[str] = (
    "The colored points indicate potential locations where the mask may need to be adjusted. "
    "The mask may need to be expanded towards these points, contracted at these locations, or both."
)
EXPANSION: Final[str] = (
    "Which point(s), if any, should be used to expand the mask toward areas of the {lesion} that are "
    "not currently covered? Select all points where expansion is needed. If no expansion is needed, "
    "select 'None'."
)
CONTRACTION: Final[str] = (
    "Which point(s), if any, should be used to contract the mask away from areas that are not part of "
    "the {lesion}? Select all points where contraction is needed. If no contraction is needed, "
    "select 'None'."
)
POINT_OPTION: Final[str] = "{color} point"
NONE_OPTION: Final[str] = "None"
POINT_COLORS: Final[tuple[str, ...]] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown")
POINT_RGB: Final[dict[str, tuple[float, float, float]]] = {
    "red": (1.0, 0.0, 0.0),
    "orange": (1.0, 0.5, 0.0),
    "yellow": (1.0, 1.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "purple": (0.5, 0.0, 0.5),
    "pink": (1.0, 0.75, 0.8),
    "brown": (0.6, 0.3, 0.0),
}
MASK_RGB: Final[tuple[float, float, float]] = (0.0, 1.0, 1.0)  # cyan
MASK_ALPHA: Final[float] = 0.5
REVIEW_RGB: Final[tuple[float, float, float]] = (1.0, 0.0, 0.0)
REVIEW_ALPHA: Final[float] = 0.33
POINT_RADIUS_AT_1024: Final[int] = 15
POINT_RING_WIDTH: Final[int] = 2

REVISION_RESULT: Final[str] = "Choose the mask that reflects the modifications."
MASK_OPTION: Final[str] = "{ordinal} mask"
ORDINALS: Final[tuple[str, ...]] = ("1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th")

# --- stage 4: attributes -------------------------------------------------------------------------
DISTRIBUTION: Final[str] = (
    "In how many zones is the {lesion} present in the image? Consider the following zones: right upper "
    "zone lung, right mid zone lung, right lower zone lung, left upper zone lung, left mid zone lung, "
    "left lower zone lung."
)
DISTRIBUTION_OPTIONS: Final[tuple[str, ...]] = ("1 zone", "2 zones", "3 zones", "4 zones or more")

LOCATION: Final[str] = (
    "Where is the {lesion} located in the image? Select all locations where the lesion is present "
    "from the options."
)
LOCATION_NONE_OPTION: Final[str] = "None of the above (options 1-3)"
SUBREGION_TEXT: Final[str] = "the intersection of the {side} {axial} lung and the {side} {zone}"
CPA_TEXT: Final[str] = "the {side} costophrenic angle"

SEVERITY: Final[str] = (
    "What proportion of the {lung} area does the {lesion} occupy? Note that the lung area excludes the "
    "heart area."
)
SEVERITY_OPTIONS: Final[tuple[str, ...]] = (
    "Less than 1/3 of the {lung} area",
    "1/3 or more but less than 2/3 of the {lung} area",
    "2/3 or more of the {lung} area",
)

COMPARISON: Final[str] = (
    "Assess and compare the sizes of the lesion across both lungs. If the lesion is present in only one "
    "lung, select the corresponding option. Note that the lung area excludes the heart area. A lesion is "
    "considered larger if it is 1.5 times or more the size of the other."
)
COMPARISON_OPTIONS: Final[tuple[str, ...]] = (
    "Both lesions are similar in size.",
    "The left lung lesion is larger than the right lung lesion.",
    "The right lung lesion is larger than the left lung lesion.",
    "The lesion is present in only one lung (left or right).",
)

# --- optional sequential revision dialogue (not part of the benchmark, §3.6) ---------------------
SEQUENTIAL_MODIFY: Final[str] = (
    "Does the segmentation mask need to be modified? If so, choose between expansion and contraction. "
    "If both are needed, choose expansion first."
)
SEQUENTIAL_MODIFY_OPTIONS: Final[tuple[str, str, str]] = (
    "expansion",
    "contraction",
    "no more modifications needed",
)
SEQUENTIAL_REGION: Final[str] = "In which anatomical region does the mask need {revision}?"
SEQUENTIAL_CLOSEST: Final[str] = "Which anatomy is the {color} point closest to?"

# --- evaluation protocol (§13) -------------------------------------------------------------------
SYSTEM_PROMPT: Final[str] = (
    "You are an expert radiologist. Analyze the given chest X-ray image and the question. Provide the "
    "final answer in the following format: 'Answer: [Option Number]'. Only the option number(s) should "
    "be included in the final answer part. (e.g., 'Answer: 1', 'Answer: 2', 'Answer: 1,3')."
)
IMPLICIT_ANSWER: Final[str] = "Answer: {gt}"
ORACLE_O1: Final[str] = (
    "Ground Truth Provided: The lesion is definitively present in this image. This is an absolute fact. "
    "Disregard your previous answer and evaluate the following questions strictly based on the confirmed "
    "presence of the lesion."
)
ORACLE_O2: Final[str] = (
    "Ground Truth Provided: The lesion mask is definitively needed to be revised in this image. This is an "
    "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on "
    "the confirmed need of revision."
)
ORACLE_O3_NONE: Final[str] = (
    "Ground Truth Provided: The lesion mask is definitively not needed to be revised using {op} operation."
)
ORACLE_O3_POINTS: Final[str] = (
    "Ground Truth Provided: The lesion mask is definitively needed to be revised using {op} operation at "
    "{points}."
)
ORACLE_O3_TAIL: Final[str] = (
    "\nThese are the absolute facts. Disregard your previous answer and evaluate the following questions "
    "strictly based on these facts."
)
ORACLE_O4: Final[str] = (
    "Ground Truth Provided: The lesion mask is definitively not needed to be revised in this image. This is "
    "an absolute fact. Disregard your previous answer and evaluate the following questions strictly based "
    "on the confirmed no need of revision of the lesion mask."
)
ORACLE_O5: Final[str] = (
    "Ground Truth Provided: The lesion mask reflecting the modifications is the {ordinal} mask.\nThis is an "
    "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on "
    "this fact."
)

# --- candidate instruction (§2) ------------------------------------------------------------------
CANDIDATE_GLOBAL: Final[str] = "Segment the {target}."
CANDIDATE_LOCATED: Final[str] = "Segment the {target} in the {location}."
BILATERAL_LOCATIONS: Final[tuple[str, str]] = ("right lung and left lung", "left lung and right lung")


def ordinal(n: int) -> str:
    """``1st``..``8th`` for 1..8, else ``{n}th`` (the option ordinals of §3.4)."""
    if n < 1:
        raise ValueError(f"ordinal needs n >= 1, got {n}")
    return ORDINALS[n - 1] if n <= len(ORDINALS) else f"{n}th"


def oracle_ordinal(n: int) -> str:
    """The O5 ordinal: ``1st``, ``2nd``, ``3rd``, else ``{n}th``."""
    return ordinal(n) if n <= 3 else f"{n}th"


def format_question(stem: str, options: Sequence[str]) -> str:
    """``{stem}\\n\\nOptions:\\n(1) a\\n(2) b``."""
    lines = "\n".join(OPTION_LINE.format(i=i, text=t) for i, t in enumerate(options, start=1))
    return QUESTION_LAYOUT.format(stem=stem, options=lines)


def detection_stem(lesion: str) -> str:
    """Stage-1 stem for ``lesion``."""
    template = DETECTION_PLAIN if lesion in DETECTION_PLAIN_LESIONS else DETECTION_SUGGESTIVE
    return template.format(lesion=lesion)


def contour_eval_stem(lesion: str) -> str:
    """Stage-2 stem; every lesion but those without the note (cardiomegaly) gets the heart note."""
    return CONTOUR_EVAL.format(lesion=lesion) + ("" if lesion in _GROUPS.no_heart_note else HEART_NOTE)


def initial_context(lesion: str) -> str:
    """Stage-3 initial context; every lesion but those without the note (cardiomegaly) gets the heart note."""
    return INITIAL_CONTEXT + ("" if lesion in _GROUPS.no_heart_note else HEART_NOTE)


def point_options(colors: Sequence[str]) -> list[str]:
    """Options of the expansion/contraction questions: ``{color} point`` lines then ``None``."""
    return [POINT_OPTION.format(color=c) for c in colors] + [NONE_OPTION]


def mask_options(n: int) -> list[str]:
    """``1st mask`` .. ``{n}th mask``."""
    return [MASK_OPTION.format(ordinal=ordinal(i)) for i in range(1, n + 1)]


def subregion_text(name: str) -> str:
    """Question text of an internal sub-region name (``right lateral lung & right lung base`` ...)."""
    if name.endswith("costophrenic angle"):
        side = name.split(" ", 1)[0]
        return CPA_TEXT.format(side=side)
    region, _, zone_name = name.partition(" & ")
    side, axial, _ = region.split(" ", 2)
    zone = zone_name.split(" ", 1)[1]
    return SUBREGION_TEXT.format(side=side, axial=axial, zone=PERCEPT_ZONE_DISPLAY[zone])


def zone_text(name: str) -> str:
    """Question text of an internal zone name (``left lung base`` → ``left lower zone lung``)."""
    side, _, zone = name.partition(" ")
    return f"{side} {PERCEPT_ZONE_DISPLAY[zone]}"


def severity_options(lung: str) -> list[str]:
    """Severity options for ``left lung`` / ``right lung``."""
    return [t.format(lung=lung) for t in SEVERITY_OPTIONS]


def oracle_o3_line(op: str, colors: Sequence[str]) -> str:
    """One O3 line for ``expansion``/``contraction``; empty ``colors`` means the GT is None."""
    if not colors:
        return ORACLE_O3_NONE.format(op=op)
    return ORACLE_O3_POINTS.format(op=op, points=_points_phrase(colors))


def oracle_o3(expansion_colors: Sequence[str], contraction_colors: Sequence[str]) -> str:
    """Full O3 text: expansion line, contraction line, then the tail."""
    lines = [oracle_o3_line("expansion", expansion_colors), oracle_o3_line("contraction", contraction_colors)]
    return "\n".join(lines) + ORACLE_O3_TAIL


def oracle_o5(n: int) -> str:
    """O5 for the ``n``-th (1-based) revision option."""
    return ORACLE_O5.format(ordinal=oracle_ordinal(n))


def candidate_instruction(target: str, location: Sequence[str]) -> str:
    """The instruction used to ask an ILS model for a candidate mask (§2)."""
    if target in HEART_MASK_LESIONS:  # "Segment the cardiomegaly."
        return CANDIDATE_GLOBAL.format(target=target)
    if not location:
        return CANDIDATE_GLOBAL.format(target=target)
    text = join_percept(location)
    if text in BILATERAL_LOCATIONS:
        return CANDIDATE_GLOBAL.format(target=target)
    return CANDIDATE_LOCATED.format(target=target, location=text)


def _points_phrase(colors: Sequence[str]) -> str:
    # `red point` | `red and blue points` | `red, blue, and green points`
    if len(colors) == 1:
        return f"{colors[0]} point"
    if len(colors) == 2:
        return f"{colors[0]} and {colors[1]} points"
    return ", ".join(colors[:-1]) + f", and {colors[-1]} points"


def question_stem(question: str, options: Sequence[str]) -> str | None:
    """Inverse of :func:`format_question`: the stem of ``question`` when it is laid out with exactly ``options``,
    else None."""
    suffix = format_question("", options)
    return question[: -len(suffix)] if question.endswith(suffix) and len(question) > len(suffix) else None
