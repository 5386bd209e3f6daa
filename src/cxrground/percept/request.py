"""One CheXpercept build as a request (:class:`BuildRequest`) and :func:`run_build`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground percept build`` offers one option per
field. The request becomes the build's settings record (:class:`~cxrground.percept.options.BuildOptions`) plus the
output folder and the run controls; the builder itself (:mod:`cxrground.percept.build`) is imported when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cxrground.errors import OptionValueError
from cxrground.fields import check_bounds, option
from cxrground.percept.deform import DEFORMERS
from cxrground.percept.options import DEFAULT_RF_RATIO, BuildOptions, parse_splits
from cxrground.vocab.lesions import LESIONS

if TYPE_CHECKING:
    from cxrground.percept.build import BuildSummary

__all__ = ["BuildRequest", "build_lines", "parse_per_lesion", "parse_rf_ratio", "run_build"]


def parse_per_lesion(value: str) -> tuple[int, int, int]:
    """``"LF,RF,RR"`` → three non-negative case counts; anything else is an :class:`OptionValueError`."""
    try:
        parts = tuple(int(v) for v in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 0:
        raise OptionValueError(f"expected LF,RF,RR (three non-negative integers), got {value!r}")
    return parts  # type: ignore[return-value]


def _ratio(text: str, value: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = float("nan")
    if not 0.0 <= ratio <= 1.0:
        raise OptionValueError(f"--rf-ratio: expected ratios in [0, 1], got {value!r}")
    return ratio


def parse_rf_ratio(value: str | float) -> tuple[float, dict[str, float]]:
    """``"R"``, ``"R,LESION=R,…"`` or ``"LESION=R,…"`` → (the ratio of every lesion not named, by default
    :data:`~cxrground.percept.options.DEFAULT_RF_RATIO`; the named lesions' ratios); a ratio outside [0, 1], an
    unknown or repeated lesion or a second plain ratio is an :class:`OptionValueError`."""
    text = str(value)
    every: float | None = None
    named: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        lesion, sep, ratio = (s.strip() for s in part.partition("="))
        if not sep:
            if every is not None:
                raise OptionValueError(f"--rf-ratio: one ratio for every lesion at most, got {text!r}")
            every = _ratio(part, text)
        elif lesion not in LESIONS:
            raise OptionValueError(f"--rf-ratio: unknown lesion {lesion!r} in {text!r}; expected one of "
                                   f"{', '.join(LESIONS)}")
        elif lesion in named:
            raise OptionValueError(f"--rf-ratio: {lesion} given twice in {text!r}")
        else:
            named[lesion] = _ratio(ratio, text)
    return (DEFAULT_RF_RATIO if every is None else every), named


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """Everything one benchmark build needs: its inputs and settings, the output folder and the run controls."""

    ils_dir: Path = option(flag="--ils", path="existing", help="ILS dataset folder (mimic_ils_instruction_answer.json,"
                           " lesion_mask/, anatomy.jsonl) or the JSON.")
    images: Path = option(path="dir", help="Image root the dataset's image_path values are relative to.")
    out: Path = option(path="out_dir", help="Benchmark folder.")
    candidates: Path | None = option(None, path="file", help="ILS-model predictions JSONL (pair_id → mask); default: "
                                     "the dataset's own masks.")
    review: Path | None = option(None, path="file",
                                 help="Expert decisions CSV: key_id,decision,reviewer with decision accept|reject.")
    per_lesion: str = option("100,100,100", help="Cases per lesion: LF,RF,RR.")
    rf_ratio: str = option(str(DEFAULT_RF_RATIO), metavar="R[,LESION=R...]",
                           help="Share of each lesion's deformation-successful positives that become revision-free "
                           "(§11), in [0, 1]: one ratio for every lesion, and LESION=R pairs for lesions set apart "
                           "(e.g. 0.5,cardiomegaly=0.3; a lesion not named takes the plain ratio, 0.5 when none is "
                           "given).")
    deformer: str = option("builtin", registry=DEFORMERS)
    sam_model: Path | None = option(None, path="dir",
                                    help="Local SAM checkpoint folder (transformers SamModel) for --deformer sam.")
    deformer_opt: dict[str, str] = option(default_factory=dict, help="KEY=VALUE for the deformer (repeatable; sam: "
                                          "device, dtype).")
    anatomy: Path | None = option(None, path="existing", help="Anatomy masks: a JSONL in the anatomy.jsonl format, or "
                                  "a folder of {study|dicom_id|image stem}_right_lung.png / _left_lung.png (/ "
                                  "_heart.png). Default: the ILS folder's anatomy.jsonl.")
    splits: str = option("train", flag="--split",
                         help="Source split(s), comma-separated (train,val,test) or 'all'.")
    seed: int = option(0, low=0, help="Seed of every draw (same inputs and seed: byte-identical benchmark).")
    workers: int = option(1, low=1, help="Processes planning the candidates.")
    max_candidates: int = option(3000, low=0, help="Positive candidates per lesion (global positives first, §11).")
    max_negatives: int = option(100, low=0,
                                help="Negative candidates per lesion (first N global negatives in JSON order).")
    exclude_positive_cxrs: bool = option(False, help="Never use a CXR of a positive candidate as a negative.")
    strict_negatives: bool = option(False, help="Location distractors must cover ≤ 0.05 of their sub-region (§9.4).")
    lf_any_film: bool = option(False, help="Lesion-free (LF) cases of a lung-opacity lesion may use a film whose "
                               "report names another lung-opacity lesion (the reference's candidates; default: "
                               "they may not, e.g. no 'no pneumonia' case on a film with consolidation).")
    drop_estimated_hearts: bool = option(False, help="Drop cardiomegaly positives whose heart mask is an estimate "
                                         "(heart_source 'estimate' in the anatomy: an outline fitted to the film "
                                         "and lungs, not a segmented heart; what the built-in anatomy gives), "
                                         "counted on the card: with a segmented heart source, so that no estimate "
                                         "is shown as the optimal heart contour. Default: kept, and the card "
                                         "counts the heart sources.")
    cpa_either_side: bool = option(False, help="The reference's costophrenic-angle quirk (§19.8): a lung-base zone "
                                   "accepts the CPA of either side (default: its own side's only).")
    overwrite: bool = option(False, help="Delete the build in --out (finished or not) and build afresh; needed to "
                                         "build with other settings into a folder holding a build.")
    keep_work: bool = option(False, help="Keep the resumption cache BENCH/.work after a complete build.")

    def __post_init__(self) -> None:
        """Refuse values outside their range (:class:`OptionValueError`, a usage error on the command line)."""
        check_bounds(self)
        parse_rf_ratio(self.rf_ratio)

    def options(self) -> BuildOptions:
        """The build's settings record (paths as text, splits and per-lesion counts parsed)."""
        chosen = parse_splits(self.splits)
        rf_ratio, rf_ratios = parse_rf_ratio(self.rf_ratio)
        return BuildOptions(ils=str(self.ils_dir), images=str(self.images),
                            candidates=str(self.candidates) if self.candidates else None,
                            review=str(self.review) if self.review else None,
                            per_lesion=parse_per_lesion(self.per_lesion), rf_ratio=rf_ratio, rf_ratios=rf_ratios,
                            deformer=self.deformer, sam_model=str(self.sam_model) if self.sam_model else None,
                            deformer_opt=dict(self.deformer_opt),
                            anatomy=str(self.anatomy) if self.anatomy else None, splits=chosen, seed=self.seed,
                            max_candidates=self.max_candidates, max_negatives=self.max_negatives,
                            exclude_positive_cxrs=self.exclude_positive_cxrs, strict_negatives=self.strict_negatives,
                            cpa_either_side=self.cpa_either_side, lf_any_film=self.lf_any_film,
                            drop_estimated_hearts=self.drop_estimated_hearts)


def run_build(request: BuildRequest, progress: bool = True) -> BuildSummary:
    """Build (or resume) the benchmark the request describes in ``request.out`` (``progress``: progress bars)."""
    from cxrground.percept.build import build_benchmark

    return build_benchmark(request.options(), request.out, workers=request.workers, overwrite=request.overwrite,
                           keep_work=request.keep_work, progress=progress)


def build_lines(summary: BuildSummary) -> list[str]:
    """What a finished build reports: counts and time, then where its card and failure list are."""
    s, out = summary, Path(summary.out_dir)
    if s.already_built:
        films = ("its films were not recorded, so they are not compared; --overwrite rebuilds it reading them again"
                 if s.films_compared is None else f"its {s.films_compared} films are unchanged")
        return [f"CheXpercept benchmark in {s.out_dir} is already built with these settings and input files ({s.cases} "
                f"cases, {s.items} items, {s.failures} dropped): nothing to do; {films}",
                f"  card: {out / 'card.md'}   failures: {out / 'failures.jsonl'}"]
    wanted = f" of {s.requested} requested" if s.requested else ""
    lines = [f"CheXpercept benchmark in {s.out_dir}: {s.cases} cases{wanted}, {s.items} items ({s.planned} positives "
             f"planned, {s.reused} reused, {s.failures} dropped) in {s.seconds} s"]
    if s.films_changed:
        lines.append(f"  {s.films_changed} film(s) changed, went or appeared since this build first looked for them: "
                     "their cases were made again")
    if s.top_drops:
        lines.append("  commonest drops: " + "; ".join(f"{n} × {reason}" for reason, n in s.top_drops))
    return [*lines, f"  card: {out / 'card.md'}   failures: {out / 'failures.jsonl'}"]
