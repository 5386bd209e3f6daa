"""Configuration of the synthetic cohort generator (one frozen object, written into ``cohort.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.io.files import sha256_json
from cxrground.vocab import LESIONS

#: Name and version of the generator; the version changes whenever the same seed would give other files.
GENERATOR_NAME: Final[str] = "cxrground.datasets.synthetic"
GENERATOR_VERSION: Final[str] = "1.0.0"

#: Per-study probability of each lesion in a non-normal study (drawn independently).
DEFAULT_PREVALENCE: Final[dict[str, float]] = {
    "cardiomegaly": 0.30,
    "pneumonia": 0.22,
    "atelectasis": 0.30,
    "opacity": 0.25,
    "consolidation": 0.18,
    "edema": 0.20,
    "effusion": 0.30,
}

IMAGE_FORMATS: Final[tuple[str, str]] = ("jpg", "png")


@dataclass(frozen=True)
class SynthConfig:
    """Everything that shapes a synthetic cohort besides the seed.

    ``width`` is the image width in pixels; the height of each study is ``width * r`` with ``r`` drawn
    uniformly from ``height_ratio_range`` (default 0.875..1.125, i.e. 448..576 px at width 512), so some
    images are not square. Every anatomical constant scales with the image size.
    """

    width: int = 512
    height_ratio_range: tuple[float, float] = (0.875, 1.125)
    prevalence: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PREVALENCE))
    #: Fraction of studies with no lesion at all (heart CTR <= 0.45, report without target findings).
    normal_fraction: float = 0.2
    #: Fraction of present, reported findings whose report sentence is hedged (``certainty: tentative``).
    tentative_fraction: float = 0.2
    #: Fraction of present findings left out of the report on purpose (``reported: false``).
    unreported_fraction: float = 0.05
    #: Fraction of non-cardiomegaly studies whose heart is borderline (0.45 < CTR <= 0.5, never normal).
    borderline_heart_fraction: float = 0.2
    #: Chance of a second instance of a focal lung lesion (pneumonia, opacity, ...) in another place.
    second_instance_fraction: float = 0.1
    #: Fraction of reports with an IMPRESSION section only (no FINDINGS).
    impression_only_fraction: float = 0.15
    #: Fraction of AP (portable) studies; the rest are PA.
    ap_fraction: float = 0.3
    #: Image file format: ``jpg`` (quality ``jpeg_quality``) or ``png``.
    format: str = "jpg"
    jpeg_quality: int = 95

    def __post_init__(self) -> None:
        if not isinstance(self.width, int) or not 64 <= self.width <= 4096:
            raise ConfigError(f"width must be an integer in 64..4096, got {self.width!r}")
        lo, hi = (float(v) for v in self.height_ratio_range)
        if not 0.5 <= lo <= hi <= 2.0:
            raise ConfigError(f"height_ratio_range must satisfy 0.5 <= lo <= hi <= 2, got {self.height_ratio_range}")
        object.__setattr__(self, "height_ratio_range", (lo, hi))
        unknown = set(self.prevalence) - set(LESIONS)
        if unknown:
            raise ConfigError(f"prevalence names unknown lesions {sorted(unknown)}; expected {LESIONS}")
        prev = {name: float(self.prevalence.get(name, DEFAULT_PREVALENCE[name])) for name in LESIONS}
        for name, value in prev.items():
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"prevalence of {name} must be in [0, 1], got {value}")
        object.__setattr__(self, "prevalence", prev)
        for name in (
            "normal_fraction",
            "tentative_fraction",
            "unreported_fraction",
            "borderline_heart_fraction",
            "second_instance_fraction",
            "impression_only_fraction",
            "ap_fraction",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.format not in IMAGE_FORMATS:
            raise ConfigError(f"format must be one of {IMAGE_FORMATS}, got {self.format!r}")
        if not 1 <= int(self.jpeg_quality) <= 100:
            raise ConfigError(f"jpeg_quality must be in 1..100, got {self.jpeg_quality!r}")

    @property
    def height_range(self) -> tuple[int, int]:
        """Smallest and largest image height in pixels."""
        lo, hi = self.height_ratio_range
        return round(self.width * lo), round(self.width * hi)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists)."""
        out = asdict(self)
        out["height_ratio_range"] = list(self.height_ratio_range)
        out["prevalence"] = dict(self.prevalence)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SynthConfig:
        """Inverse of :meth:`to_dict`; unknown keys are a :class:`ConfigError`."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown SynthConfig field(s) {sorted(unknown)}")
        kwargs = dict(data)
        if "height_ratio_range" in kwargs:
            kwargs["height_ratio_range"] = tuple(kwargs["height_ratio_range"])
        return cls(**kwargs)

    def config_hash(self) -> str:
        """Short stable hash of the configuration and the generator version (resume compatibility)."""
        return sha256_json({"version": GENERATOR_VERSION, "config": self.to_dict()})[:16]
