"""Backends that tests register at run time (not on import of cxrground): they live in an importable module, so
worker processes can unpickle them."""

from __future__ import annotations

from typing import Any

from cxrground.anatomy.segment.builtin import UNetLungSegmenter
from cxrground.errors import ConfigError
from cxrground.percept.deform.builtin import BuiltinDeformer
from cxrground.reports.findings import Finding, StructuredReport
from cxrground.reports.model import SectionChoice
from cxrground.reports.structure import RuleStructurer


class RuntimeUNet(UNetLungSegmenter):
    """The shipped lung U-Net under another name."""

    name = "t-runtime-unet"


class RuntimeRules(RuleStructurer):
    """The rules structurer under another name."""

    name = "t-runtime-rules"


class UnbuildableSegmenter:
    """A segmenter that cannot be created (e.g. its weights are missing)."""

    name = "t-unbuildable"

    def __init__(self) -> None:
        raise ConfigError("segmenter 't-unbuildable' needs weights: download them first")


#: What :class:`WrongStructurer` puts in the finding it adds, by mode.
WRONG: dict[str, dict[str, Any]] = {
    "lesion": {"lesion": "pneumothorax", "entity": "pneumothorax"},
    "assertion": {"assertion": "maybe"},
    "sentence": {"sent_idx": 99},
    "location": {"reported_location": ("left lower lobe",)},
    "location-type": {"reported_location": ["left lung"]},
}


class WrongStructurer:
    """The rules structurer's findings, plus one wrong finding (``mode``: a key of :data:`WRONG`) in the reports
    whose id is in ``only`` (every report when empty)."""

    name = "t-wrong"

    def __init__(self, mode: str = "lesion", only: tuple[str, ...] = ()) -> None:
        self.mode, self.only = mode, tuple(only)
        self.rules = RuleStructurer()

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode}

    def structure(self, report_id: str, section: SectionChoice) -> StructuredReport:
        found = self.rules.structure(report_id, section)
        if self.only and report_id not in self.only:
            return found
        fields: dict[str, Any] = {"entity": "effusion", "sent_idx": 1, "assertion": "present", "lesion": "effusion",
                                  "location_phrases": (), "reported_location": ("left lung",), "source": self.name}
        fields.update(WRONG[self.mode])
        return StructuredReport(report_id, section, (*found.findings, Finding(**fields)))


class RuntimeDeformer(BuiltinDeformer):
    """The built-in CheXpercept deformer under another name."""

    name = "t-runtime-deformer"
