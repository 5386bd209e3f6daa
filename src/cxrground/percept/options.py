"""The settings of one CheXpercept build (:class:`BuildOptions`): written to the card, hashed to guard resumption."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Final

from cxrground.ils.schema import SPLITS
from cxrground.io.files import sha256_json

__all__ = ["DEFAULT_RF_RATIO", "BuildOptions", "parse_splits"]

#: §11: the share of a lesion's deformation-successful positives that become revision-free, unless set.
DEFAULT_RF_RATIO: Final[float] = 0.5


def parse_splits(text: str) -> tuple[str, ...]:
    """``--split`` as split names: ``"train,test"`` → ``("train", "test")``; ``"all"`` → every split."""
    return SPLITS if text == "all" else tuple(s.strip() for s in text.split(","))


@dataclass(frozen=True)
class BuildOptions:
    """Every setting of one build (written to the card; its hash guards resumption)."""

    ils: str
    images: str
    candidates: str | None = None
    review: str | None = None
    per_lesion: tuple[int, int, int] = (100, 100, 100)
    rf_ratio: float = DEFAULT_RF_RATIO
    rf_ratios: dict[str, float] = field(default_factory=dict)  # §11 per-lesion ratios (``--rf-ratio LESION=R``)
    deformer: str = "builtin"
    sam_model: str | None = None
    deformer_opt: dict[str, str] = field(default_factory=dict)  # the deformer's options (``--deformer-opt``)
    anatomy: str | None = None
    splits: tuple[str, ...] = ("train",)
    seed: int = 0
    max_candidates: int = 3000
    max_negatives: int = 100
    exclude_positive_cxrs: bool = False
    strict_negatives: bool = False
    cpa_either_side: bool = False  # §19.8: True = the reference's quirk (a lung-base zone takes either side's CPA)
    lf_any_film: bool = False  # True = the reference's LF candidates (any film with the global negative)
    drop_estimated_hearts: bool = False  # True = cardiomegaly positives whose heart mask is an estimate are dropped

    def settings_hash(self) -> str:
        """Hash of the settings that change the output (not paths of the output or worker counts). A setting
        added later is left out at the value that reproduces the builds made before it existed, so that they keep
        their hash."""
        settings = asdict(self)
        if not self.cpa_either_side:
            del settings["cpa_either_side"]
        if not self.deformer_opt:
            del settings["deformer_opt"]
        if not self.rf_ratios:
            del settings["rf_ratios"]
        if self.lf_any_film:  # what builds made before the setting existed did
            del settings["lf_any_film"]
        if not self.drop_estimated_hearts:  # likewise
            del settings["drop_estimated_hearts"]
        return sha256_json(settings)[:16]

    def rf_ratio_of(self, lesion: str) -> float:
        """The share of ``lesion``'s deformation-successful positives that become revision-free (§11)."""
        return self.rf_ratios.get(lesion, self.rf_ratio)

    def rf_ratio_text(self) -> str:
        """The ratios for the card: ``R``, then ``(LESION R, …)`` for the lesions set apart."""
        apart = ", ".join(f"{lesion} {ratio}" for lesion, ratio in sorted(self.rf_ratios.items()))
        return f"{self.rf_ratio}" + (f" ({apart})" if apart else "")
