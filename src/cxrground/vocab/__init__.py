"""Single source of truth for the vocabulary and every template string.

- :mod:`.lesions`: the seven lesions and their groups.
- :mod:`.locations`: ILS location labels, CheXpercept zones, the two join rules.
- :mod:`.ils_templates`: ILS instructions and answers (ILS.md §4).
- :mod:`.percept_templates`: CheXpercept questions, options, prompts and oracle texts.

Other modules take every user-visible string from here.
"""

from cxrground.vocab.lesions import (
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

__all__ = [
    "BOTH_LUNGS",
    "EVAL_ORDER",
    "HEART",
    "ILS_LOCATION_LABELS",
    "LESIONS",
    "LESION_INFERENCE_LESIONS",
    "LUNG_LESIONS",
    "PERCEPT_ZONES",
    "SIDES",
    "check_lesion",
    "join_ils",
    "join_percept",
    "split_ils",
]
