"""Single source of truth for the vocabulary and every template string.

- :mod:`.traits`: the per-lesion trait table (anatomy, extent, contrast, ILS and CheXpercept rules, colours).
- :mod:`.lesions`: the seven lesions and their groups (derived from the trait table).
- :mod:`.locations`: ILS location labels, CheXpercept zones, the two join rules.
- :mod:`.ils_templates`: ILS instructions and answers (ILS.md §4).
- :mod:`.percept_templates`: CheXpercept questions, options, prompts and oracle texts.
- :mod:`.display`: readable names of internal keys (report sections, instruction types, case paths) for pages.

Other modules take every user-visible string from here.
"""

from cxrground.vocab.lesions import (
    CURATION_ORDER,
    EVAL_ORDER,
    LESION_INFERENCE_LESIONS,
    LESIONS,
    LUNG_LESIONS,
    check_lesion,
)
from cxrground.vocab.locations import (
    BOTH_LUNGS,
    HEART,
    ILS_LOCATION_LABELS,
    PERCEPT_ZONES,
    SIDES,
    join_ils,
    join_percept,
    split_ils,
)
from cxrground.vocab.traits import LESION_TRAITS, LesionTraits, is_diffuse, lives_in, traits

__all__ = [
    "BOTH_LUNGS",
    "CURATION_ORDER",
    "EVAL_ORDER",
    "HEART",
    "ILS_LOCATION_LABELS",
    "LESIONS",
    "LESION_INFERENCE_LESIONS",
    "LESION_TRAITS",
    "LUNG_LESIONS",
    "PERCEPT_ZONES",
    "SIDES",
    "LesionTraits",
    "check_lesion",
    "is_diffuse",
    "join_ils",
    "join_percept",
    "lives_in",
    "split_ils",
    "traits",
]
