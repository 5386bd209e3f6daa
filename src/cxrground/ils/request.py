"""One ILS build as a request (:class:`BuildRequest`: inputs, backends, split, thresholds) and :func:`run_build`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground ils build`` offers one option per field.
The build engine itself is :mod:`cxrground.ils.build`, imported only when a build runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cxrground.anatomy.segment import SEGMENTERS
from cxrground.datasets.views import find_view_table, read_view_table, view_table_record
from cxrground.errors import ConfigError, Failure, InputError, OptionError, OptionValueError, first_failure
from cxrground.fields import check_bounds, option
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import (
    GROUNDED_LOCATION_SOURCES,
    NEGATIVE_CHECKS,
    NEGATIVE_EXCLUSIONS,
    ZONE_GUIDES,
    IlsConfig,
    QCConfig,
)
from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS
from cxrground.ils.tasks import find_split_file, read_exclusions
from cxrground.io.image import DEFAULT_MAX_PIXELS, MAX_PIXELS_HELP
from cxrground.io.store import is_url
from cxrground.reports.model import DEFAULT_SECTION_POLICY, SECTION_POLICIES
from cxrground.reports.structure import STRUCTURERS, structurer_options
from cxrground.reports.structure.llm import DEFAULT_MAX_TOKENS, DEFAULT_SEED, stats_line
from cxrground.reports.structure.rules import ALTERNATIVE_POLICIES, DEFAULT_ALTERNATIVES

if TYPE_CHECKING:
    from cxrground.ils.build import BuildSummary

__all__ = ["PAPER_RULES", "BuildRequest", "build_lines", "run_build"]


#: The :class:`IlsConfig` fields of ILS.md's rules read literally (``ils build --paper-rules``).
PAPER_RULES: Final[dict[str, Any]] = {"zone_guide": "none", "silent_report_negatives": True,
                                      "grounded_location": "boxes", "prominent_heart_negative": True}


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """Everything one ILS build needs besides its progress display."""

    images: Path | str = option(path="dir_or_url", help="Image folder (MIMIC-CXR-JPG files/ layout, or flat with "
                                "--index), a local path or an s3:// / gs:// / file:// URL.")
    reports: Path | str | None = option(None, path="existing_or_url", help="Report folder (MIMIC-CXR layout) or a "
                                        "JSONL/CSV table with study_id and report columns, a path or URL; a study "
                                        "whose report it does not hold is a failure (failures.jsonl), even with a "
                                        "report beside its images. Default: reports beside the study folders.")
    index: Path | None = option(None, path="file",
                                help="CSV/JSONL index for a flat folder: image, study_id, report_path or report; "
                                "optional subject_id (keeps a patient's studies in one split), dicom_id, view. A "
                                "film under --images that no row names is not used and is a failure (failures.jsonl; "
                                "--strict exits 3).")
    metadata: Path | None = option(None, path="file", help="View table: MIMIC-CXR-JPG's "
                                   "mimic-cxr-2.0.0-metadata.csv[.gz] or any CSV with dicom_id and ViewPosition "
                                   "(or view): each study uses a PA, else an AP image, never a lateral one. "
                                   "Default: that file in the image folder or its parent, when there.")
    out: Path | str = option(path="out_dir_or_url", help="Output folder, a local path or an s3:// / gs:// / "
                             "file:// URL (units and masks written there atomically; resumable).")
    engine: str = option("local", choices=("local", "ray"), help="local: a process pool on this machine; ray: Ray "
                         "actors (a local Ray instance, or --ray-address).")
    workers: int = option(1, low=1, help="Worker processes (local) or Ray actors (ray), each processing one study at a "
                          "time.")
    ray_address: str | None = option(None, help="Ray cluster of --engine ray: 'auto' (the cluster this node "
                                     "belongs to), HOST:6379 or ray://HOST:10001. Default: $RAY_ADDRESS, else a "
                                     "new local Ray instance with --workers CPUs (not a cluster that ray start runs "
                                     "here: give auto for that). Every node must see --out (a shared mount or an "
                                     "object-storage URL).")
    retry_failed: bool = option(False, help="Process again the studies whose earlier attempt failed (a worker that "
                                "died, a file unreadable then); studies rejected by QC stay rejected.")
    structurer: str = option("rules", registry=STRUCTURERS)
    structurer_opt: dict[str, str] = option(default_factory=dict, help="KEY=VALUE for the structurer (llm: "
                                            "base_url, model, api_key_env, cache, concurrency).")
    max_tokens: int | None = option(None, low=1, show_default=str(DEFAULT_MAX_TOKENS),
                                    help="LLM structurer: most tokens of each answer; an answer the server cuts there "
                                         "fails its study. A --structurer-opt max_tokens given too must agree.")
    sections: str = option(DEFAULT_SECTION_POLICY, choices=SECTION_POLICIES, help="Report section policy: findings "
                           "(ILS §6: findings, else impression, else the last paragraph), impression (impression "
                           "first), findings+impression (both, numbered on; repeats counted once).")
    alternatives: str | None = option(None, choices=ALTERNATIVE_POLICIES, show_default=DEFAULT_ALTERNATIVES,
                                      help="Rule structurer: 'atelectasis or scarring' is uncertain (ILS.md §7.1) or "
                                           "present.")
    segmenter: str = option("unet", registry=SEGMENTERS)
    segmenter_opt: dict[str, str] = option(default_factory=dict,
                                           help="KEY=VALUE for the segmenter (repeatable), e.g. weights=PATH.")
    qc_segmenter: str | None = option(None, registry=SEGMENTERS, help="Second segmenter for the §6 cross-check (e.g. "
                                      "cxas with --segmenter hybridgnet); studies whose lung borders or heart bottom "
                                      "disagree by > 5 % are dropped. ")
    qc_segmenter_opt: dict[str, str] = option(default_factory=dict,
                                              help="KEY=VALUE for the qc-segmenter (repeatable).")
    qc_orientation: bool = option(False, help="Reject films that look turned or flipped (the built-in U-Net reads "
                                  "their lungs better turned 180°, flipped top-bottom or turned 90°; the lung checks "
                                  "pass most such films). Of the pack's films that pass the lung checks: 95-97 % of "
                                  "those so stored and 0.2 % of upright ones rejected; mirrored films are not "
                                  "rejected (the pose warning lists them). Three U-Net passes per film on a small "
                                  "grid.")
    pose_warning: bool = option(True, flag="--pose-warning/--no-pose-warning",
                                help="List the films that look stored mirrored, turned or flipped (the pose reader, "
                                "one small CNN pass per film) in their unit records and on the card; nothing is "
                                "rejected. On held-out films: 98-100 % of mirrored films found, 3-6 % of upright "
                                "ones listed. Needs torch.")
    pose_weights: Path | None = option(None, path="file", help="Pose reader weights (.safetensors beside its .json "
                                       "sidecar), e.g. from 'cxrground segment train-pose --images'. Default: the "
                                       "shipped pose_net_v1.")
    synthesizer: str = option("normative", registry=SYNTHESIZERS)
    synthesizer_opt: dict[str, str] = option(default_factory=dict, help="KEY=VALUE for the synthesizer (repeatable).")
    detector: str = option("anomaly", registry=DETECTORS)
    detector_opt: dict[str, str] = option(default_factory=dict, help="KEY=VALUE for the detector (repeatable).")
    negative_check: str = option("none", choices=NEGATIVE_CHECKS, help="Image check of lung-lesion negatives: "
                                 "zone_prior_v1 places them away from the zones the position-prior zone reader "
                                 "flags in a film where the lesion segmenter finds a lesion (dropped only when no "
                                 "unflagged region is left; counted on the card); zone_prior_v2 does the same with "
                                 "the reader whose film severity also reads the lesion segmenter (flags more "
                                 "zones), zone_prior_v3 with that severity refitted on the shipped lungs; "
                                 "algorithm1 flags a zone where Algorithm 1, asked to ground an opacity "
                                 "reported there, draws a mask (the chain's own anomaly map and boxes). Zones the "
                                 "report's own lung findings name are never flagged.")
    negative_exclusion: str = option("location", choices=NEGATIVE_EXCLUSIONS, help="Where a reported finding keeps "
                                     "lung-lesion negatives away: location (ILS: the labels overlapping its "
                                     "reported location) or lung (the whole lung it is reported in; a global "
                                     "lung negative only when both lungs are free).")
    silent_report_negatives: bool = option(False, help="Let a report that says nothing about the film (no finding "
                                           "of any kind, no normal-examination statement) yield lung and pleural "
                                           "negatives. Default: it yields none (counted on the card).")
    global_negatives_need_region: bool = option(False, help="Make a global lung negative (\"There is no edema.\") "
                                                "only where a basic one could be placed (some location the report "
                                                "leaves empty), so each lesion's global share of its negatives is "
                                                "the ILS train-split target. Default: whatever the report covers.")
    zone_guide: str = option("zone_prior_v2", choices=ZONE_GUIDES, help="Guide lung-lesion masks by a zone "
                             "reader: a reported lung lesion keeps a mask only in the zones of its reported location "
                             "that the reader flags (Algorithm 1's mask cut to them; for airspace lesions an empty "
                             "flagged zone is filled where the lesion segmenter's smoothed probability is highest) "
                             "and gets no pair when the reader flags none of them. none: Algorithm 1 alone.")
    grounded_location: str = option("mask", choices=GROUNDED_LOCATION_SOURCES, help="How a finding's grounded "
                                    "location is read: the reported labels the drawn mask meets within the "
                                    "selected boxes (mask), or those meeting a selected box (boxes, ILS.md §10 "
                                    "literally).")
    prominent_heart_negative: bool = option(False, help="Give a heart the report calls prominent the CTR-decided "
                                            "cardiomegaly negative (ILS §11.2 literally). Default: no cardiomegaly "
                                            "pair for it (counted on the card).")
    paper_rules: bool = option(False, help="ILS.md's rules read literally where the build departs from them by "
                               "default: --zone-guide none, --silent-report-negatives, --grounded-location boxes "
                               "and --prominent-heart-negative, whatever those options say.")
    split_file: Path | None = option(None, path="file", help="CSV with study_id,split, plain or gzipped (e.g. "
                                     "mimic-cxr-2.0.0-split.csv.gz). Default: that file in the image folder or its "
                                     "parent when there (MIMIC-CXR-JPG's official split), else by subject hash.")
    split_ratios: str = option("0.8,0.1,0.1", help="Train,val,test shares of the subject-hash split (used when "
                               "there is no split file).")
    exclude: Path | None = option(None, path="file",
                                  help="Studies to leave out: one study id per line, or a CSV with a study_id or "
                                  "path column (MS-CXR's MS_CXR_Local_Alignment_v1.*.csv works as it is).")
    threshold_scale: float = option(1.0, low=0.0, low_open=True, help="Multiply every Table 7 threshold (0.5 = the "
                                    "paper's half-τ setting).")
    limit: int | None = option(None, low=1, help="Process only the first N studies (by study id).")
    seed: int = option(0, low=0, help="Seed of every random draw (negative regions and kinds, the normative fit); "
                       "with --structurer llm also the seed sent with each request, which is part of the response "
                       "cache's key (--structurer-opt seed=N sends N instead).")
    overwrite: bool = option(False, help="Start afresh: discard a previous build in OUT (its units, masks, fitted "
                               "model and settings). Without it a build with the same settings resumes and one with "
                               "other settings (or, when its normative model was fitted on its own studies, other "
                               "inputs) is refused.")
    max_pixels: int = option(DEFAULT_MAX_PIXELS, low=1, show_default=True, help=MAX_PIXELS_HELP)

    def check(self) -> None:
        """Raise :class:`OptionValueError` for a count or scale out of range (the command line's ranges, for library
        callers), and :class:`OptionError` for an output folder inside a local image folder (a rerun would read
        its own masks as images)."""
        check_bounds(self)
        self.ratios()
        if self.pose_weights is not None and not self.pose_warning:
            raise OptionError("--pose-weights reads the films' pose; it does nothing with --no-pose-warning")
        self._check_max_tokens()
        if self.ray_address is not None and self.engine != "ray":
            raise OptionError("--ray-address names the cluster of --engine ray; add --engine ray (without it the "
                              "build runs on this machine)")
        if not is_url(self.images) and not is_url(self.out):
            images, out = Path(self.images).resolve(), Path(self.out).resolve()
            if out == images or images in out.parents:
                raise OptionError(f"--out {self.out} is inside the image folder {self.images}: a rerun would scan "
                                  "the dataset's own masks as images; write the dataset to another folder")

    def _check_max_tokens(self) -> None:
        """:class:`OptionError` for ``--max-tokens`` with a structurer without that option, or with a
        ``--structurer-opt max_tokens`` of another value."""
        if self.max_tokens is None:
            return
        if "max_tokens" not in STRUCTURERS.options(self.structurer):
            users = [n for n in STRUCTURERS.names() if "max_tokens" in STRUCTURERS.options(n)]
            raise OptionError(f"--max-tokens applies to the {' / '.join(users)} structurer only, and the structurer "
                              f"is {self.structurer} (--structurer {users[0]} to use it)")
        raw = self.structurer_opt.get("max_tokens")
        if raw is not None and raw.strip() != str(self.max_tokens):
            raise OptionError(f"--max-tokens {self.max_tokens} and --structurer-opt max_tokens={raw} give the "
                              "structurer two values of max_tokens: give one of them")

    def structurer_flags(self) -> dict[str, str]:
        """The structurer options set by the dedicated options (``--max-tokens``; with the ``llm`` structurer, the
        build's ``--seed`` unless ``--structurer-opt seed`` is given), as ``--structurer-opt`` gives them (text), so
        that both spellings make one backend spec. The build's default seed is the LLM structurer's own default, and
        is not added: the backend spec names the seed only when it is another."""
        flags: dict[str, str] = {}
        if self.max_tokens is not None:
            flags["max_tokens"] = str(self.max_tokens)
        if self.structurer == "llm" and "seed" not in self.structurer_opt and self.seed != DEFAULT_SEED:
            flags["seed"] = str(self.seed)
        return flags

    def ratios(self) -> tuple[float, float, float]:
        """``split_ratios`` as numbers; anything but three non-negative numbers with a positive sum is an
        :class:`OptionValueError`."""
        bad = OptionValueError(f"--split-ratios must be three non-negative numbers with a positive sum, e.g. "
                               f"0.8,0.1,0.1; got {self.split_ratios!r}")
        try:
            values = tuple(float(v) for v in self.split_ratios.split(","))
        except ValueError:
            raise bad from None
        if len(values) != 3 or any(not v >= 0 for v in values) or not 0 < sum(values) < float("inf"):
            raise bad
        return values  # type: ignore[return-value]

    def reports_folder_problem(self) -> str | None:
        """Why a local ``reports`` folder cannot give any report (it holds no ``.txt`` file), or None."""
        if self.reports is None or is_url(self.reports):
            return None
        folder = Path(self.reports)
        if not folder.is_dir() or next(folder.rglob("*.txt"), None) is not None:
            return None
        return "no report (.txt, MIMIC-CXR layout) found in this --reports folder"

    def excluded(self) -> tuple[str, ...]:
        """The study ids of the ``exclude`` file (:func:`~cxrground.ils.tasks.read_exclusions`); none without it."""
        if self.exclude is None:
            return ()
        return read_exclusions(self.exclude)

    def splits(self) -> Path | None:
        """The split file: ``split_file``, else MIMIC-CXR-JPG's split table in or beside a local image folder."""
        return Path(self.split_file) if self.split_file is not None else self._release_table(find_split_file)

    def view_table(self) -> Path | None:
        """The view table: ``metadata``, else MIMIC-CXR-JPG's metadata file in or beside a local image folder."""
        return Path(self.metadata) if self.metadata is not None else self._release_table(find_view_table)

    def _release_table(self, find: Callable[[str], Path | None]) -> Path | None:
        """What ``find`` finds for a local image folder (none for object storage)."""
        if is_url(self.images) and not str(self.images).startswith("file://"):
            return None
        return find(str(self.images).removeprefix("file://"))

    def rule_options(self) -> dict[str, Any]:
        """The :class:`IlsConfig` fields of the rules where the build departs from ILS.md by default: as given, or
        ILS.md's literal rules with ``paper_rules``."""
        if self.paper_rules:
            return dict(PAPER_RULES)
        return {"zone_guide": self.zone_guide, "silent_report_negatives": self.silent_report_negatives,
                "grounded_location": self.grounded_location,
                "prominent_heart_negative": self.prominent_heart_negative}

    def backend_spec(self) -> BackendSpec:
        """The backends with their options; structurer options that do not fit the structurer are an
        :class:`OptionError`."""
        try:
            structurer_kwargs = {**self.structurer_opt, **self.structurer_flags(),
                                 **structurer_options(self.structurer, {"alternatives": self.alternatives})}
        except ConfigError as exc:
            raise OptionError(str(exc)) from None
        return BackendSpec(self.structurer, structurer_kwargs, self.segmenter, self.segmenter_opt, self.synthesizer,
                           self.synthesizer_opt, self.detector, self.detector_opt, self.qc_segmenter,
                           self.qc_segmenter_opt)


def run_build(request: BuildRequest, progress: bool = True, note: Callable[[str], None] | None = None
              ) -> BuildSummary:
    """Check the backends, scan the inputs and build (or resume) the dataset in ``request.out``; ``note`` gets the
    LLM structurer's retry notes (see :func:`~cxrground.ils.build.build_dataset`)."""
    from cxrground.datasets.synthetic import cohort_of_images
    from cxrground.ils.build import build_dataset, check_backends, check_workers
    from cxrground.ils.tasks import build_tasks, split_record, studies_without_subject

    request.check()
    problem = request.reports_folder_problem()
    if problem is not None:
        raise InputError(problem, request.reports)
    excluded = request.excluded()
    ratios = request.ratios()
    config = IlsConfig(seed=request.seed, exclude_studies=excluded, sections=request.sections,
                       qc=QCConfig(orientation_check=request.qc_orientation, pose_warning=request.pose_warning,
                                   pose_weights=str(Path(request.pose_weights).resolve())
                                   if request.pose_weights is not None else None),
                       negative_check=request.negative_check, negative_exclusion=request.negative_exclusion,
                       global_negative_needs_region=request.global_negatives_need_region, **request.rule_options())
    if request.threshold_scale != 1.0:
        config = config.with_threshold_scale(request.threshold_scale)
    spec = request.backend_spec()
    check_backends(spec, config, request.engine)  # before scanning a large folder
    check_workers(spec, request.engine, request.workers)
    table, split_file = request.view_table(), request.splits()
    views = read_view_table(table) if table is not None else None
    tasks, failures = build_tasks(request.images, request.reports, request.index, split_file, ratios,
                                  excluded, request.limit, views)
    if not tasks:
        raise InputError(_no_studies(request, failures))
    return build_dataset(tasks, request.out, config, spec, request.engine, request.workers, failures,
                         request.overwrite, progress,
                         None if is_url(request.images) else cohort_of_images(Path(request.images).absolute()),
                         max_pixels=request.max_pixels,
                         retry_failed=request.retry_failed, ray_address=request.ray_address,
                         view_table=view_table_record(table, views) if table is not None and views is not None
                         else None, split=split_record(split_file, ratios, studies_without_subject(tasks)),
                         limit=request.limit, note=note)


def _no_studies(request: BuildRequest, failures: list[Failure]) -> str:
    """Why a build found nothing to do: where it looked, how many inputs failed and the first of them."""
    where = f"in the index {request.index}" if request.index is not None else f"under {request.images}"
    first = first_failure(failures)
    return f"no studies found {where} ({len(failures)} inputs failed{first})"


def build_lines(summary: BuildSummary) -> list[str]:
    """What a finished build reports: counts and time, where its card and failure list are, the mask frame and
    the export the reference code needs, the LLM structurer's counters (requests, retries, ...), then warnings."""
    out = str(summary.out_dir)

    def inside(name: str) -> str:  # a file of the output folder, as the user names it (a URL stays one)
        return f"{out.rstrip('/')}/{name}" if is_url(out) else str(Path(out) / name)

    lines = [f"ILS dataset in {out}: {summary.studies_in_dataset} studies, {summary.pairs} pairs "
             f"({summary.processed} processed, {summary.skipped} already done, {summary.failures} failures"
             + (f", {summary.without_pairs} without pairs: named on the card" if summary.without_pairs else "")
             + ") "
             f"in {summary.seconds:.1f} s", f"  card: {inside('card.md')}   failures: {inside('failures.jsonl')}"]
    if summary.pairs:
        lines.append(f"  masks at each film's native size; for the ROSALIA/LISA reference code, export them to its "
                     f"frame first: cxrground ils export --dataset {out} --frame released --out DIR"
                     + (" (from a local copy of the folder)" if is_url(out) else ""))
    if summary.llm_counts is not None:
        lines.append(f"  {stats_line(summary.llm_counts)}")
    if summary.first_failure:
        lines.append(f"  first failure: {summary.first_failure}")
    if summary.every_failed:
        lines.append(f"  error: every study failed; the reasons are in {inside('failures.jsonl')}")
    if summary.blind_choices:
        lines.append(f"  warning: {summary.blind_choices} studies offered several images of unknown view, and the "
                     "first dicom_id may be a lateral film; give the view table (--metadata)")
    if summary.pose_warnings:
        films = "1 film looks" if summary.pose_warnings == 1 else f"{summary.pose_warnings} films look"
        lines.append(f"  warning: {films} stored mirrored, turned or flipped (listed on the "
                     "card, not rejected): look at them, e.g. with cxrground anatomy pose")
    return lines
