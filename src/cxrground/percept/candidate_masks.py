"""Candidate lesion masks for a CheXpercept build, predicted by an ILS model for the CheXpercept instruction.

The benchmark's candidate mask of a positive case is what an ILS model segments when asked the candidate
instruction of CHEXPERCEPT.md §2 (``Segment the {target} in the {location}.``, built by
:func:`cxrground.vocab.percept_templates.candidate_instruction` from the pair's reported location), not the ILS
pair's own instruction: a global pair asks ``Segment the opacity.`` where the candidate instruction names where the
report puts it, and a tentative pair names another lesion. :func:`predict_candidates` asks a checkpoint exactly the
candidate instruction of every positive candidate ``percept build`` would plan (same splits and
``max_candidates``), and writes the predictions JSONL that ``percept build --candidates`` reads, keyed by the
source ``pair_id``, each line recording the instruction it was made for. Resumable as ``ils predict`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cxrground.errors import InputError
from cxrground.fields import check_bounds, option
from cxrground.ils.schema import dataset_splits, read_dataset
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.percept.cases import Candidate, positive_candidates
from cxrground.percept.options import parse_splits
from cxrground.vocab.lesions import LESIONS

__all__ = ["CandidatesRequest", "candidate_jobs", "predict_candidates"]


@dataclass(frozen=True, kw_only=True)
class CandidatesRequest:
    """The positive candidates of a benchmark build to segment with an ILS checkpoint, and where the masks go
    (``cxrground percept candidates`` offers one option per field)."""

    checkpoint: Path = option(path="existing", help="ILS model checkpoint folder (checkpoint.json names the backend).")
    ils_dir: Path = option(flag="--ils", path="existing", help="ILS dataset folder or its JSON (the one `percept "
                           "build --ils` reads).")
    images: Path = option(path="dir", help="Image root the dataset's image_path values are relative to.")
    out: Path = option(path="out_file", help="Predictions JSONL for `percept build --candidates` (appended to; "
                       "candidates already there are skipped when they come from the same checkpoint, dataset and "
                       "splits, recorded in OUT.checkpoint.json; another one is refused).")
    splits: str = option("train", flag="--split", help="Source split(s), comma-separated (train,val,test) or 'all', "
                         "as given to `percept build`.")
    max_candidates: int = option(3000, low=0, help="Positive candidates per lesion, as given to `percept build`.")
    batch_size: int = option(8, low=1, help="Instructions per forward pass.")
    device: str = option("cpu", help="torch device: cpu, cuda, cuda:1, mps ...")
    max_pixels: int = option(DEFAULT_MAX_PIXELS, low=1, show_default=True, help="Images whose header states more "
                             "pixels are recorded as failures without being decoded.")

    def __post_init__(self) -> None:
        """Refuse values outside their range (:class:`~cxrground.errors.OptionValueError`)."""
        check_bounds(self)


def candidate_jobs(candidates: dict[str, list[Candidate]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Per image (in first-candidate order): its positive candidates as prediction items, ``pair_id`` and the §2
    ``instruction``; a pair that is a candidate of one lesion only appears once."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for lesion in LESIONS:
        for c in candidates.get(lesion, []):
            if c.pair_id in seen:
                continue
            seen.add(c.pair_id)
            jobs.setdefault(c.image_path, []).append({"pair_id": c.pair_id, "instruction": c.instruction})
    return list(jobs.items())


def predict_candidates(request: CandidatesRequest, progress: bool = True) -> str:
    """Segment every positive candidate of the request's splits for its candidate instruction into
    ``request.out`` (resuming) and say what was written."""
    from cxrground.models.base import load_model
    from cxrground.models.predict import (
        check_device,
        predict_jobs,
        prediction_source,
        prediction_summary,
        run_recorded,
    )

    r = request
    check_device(r.device)
    splits = parse_splits(r.splits)
    data = read_dataset(r.ils_dir, ("image_path", "dicom_id"), LESIONS, splits=splits)
    missing = [s for s in splits if s not in data and r.splits != "all"]
    if missing:
        raise InputError(f"split(s) {', '.join(missing)} not in the dataset (its splits: "
                         f"{', '.join(dataset_splits(r.ils_dir))})", r.ils_dir)
    jobs = candidate_jobs(positive_candidates(data, [s for s in splits if s in data], r.max_candidates))
    source = prediction_source(r.checkpoint, r.ils_dir, ",".join(splits), prompts="chexpercept-candidates",
                               images=r.images)

    def run() -> str:
        model = load_model(r.checkpoint, device=r.device)
        counts = predict_jobs(model, jobs, r.images, r.out, batch_size=r.batch_size, progress=progress,
                              max_pixels=r.max_pixels)
        return prediction_summary(counts, r.out, "of the candidates", r.images, unit="candidates")

    return run_recorded(r.out, source, run)
