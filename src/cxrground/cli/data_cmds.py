"""Data commands: the synthetic cohort (``synth``, ``synth-info``), the shared pack and a user's own folders."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import DIR, EXISTING, FILE, clean_errors, echo_lines, group, request_options
from cxrground.datasets.folder import StudyInput, films_not_in_index, scan_folder, scan_lines
from cxrground.datasets.pack import Pack
from cxrground.datasets.synthetic.cohort import CohortRequest, summary_text, write_requested_cohort
from cxrground.datasets.views import load_view_table, views_by_study


@click.command("synth")
@request_options(CohortRequest)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def synth(request: CohortRequest, quiet: bool) -> None:
    """Generate the synthetic cohort: CXR phantoms, MIMIC-style reports and exact ground truth (TEST DATA)."""
    click.echo("\n".join(write_requested_cohort(request, progress=not quiet).describe()))


@click.command("synth-info")
@click.argument("cohort_dir", type=DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@clean_errors(FileNotFoundError)
def synth_info(cohort_dir: Path, as_json: bool) -> None:
    """Per-lesion counts (present, definitive, tentative, unreported, negated), sizes and CTR range."""
    click.echo(summary_text(cohort_dir, as_json))


@group("pack")
def pack() -> None:
    """The shared real-data pack cxr-pack-v1 (read in place, never copied)."""


@pack.command("info")
@click.option("--path", "path", type=click.Path(path_type=Path), default=None,
              help="Pack folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@click.option("--verify", is_flag=True,
              help="Also check every file against MANIFEST.sha256 and every table row, and list each problem "
                   "(exit 1 when there is one).")
def pack_info(path: Path | None, verify: bool) -> None:
    """Print what the pack holds: images, masks, labels, licences, reports (counted from its tables' rows; a file
    a row names that is missing is listed)."""
    from cxrground.errors import InputError

    p = Pack(path)
    if not verify:
        click.echo("\n".join(p.describe()))
        return
    problems = p.verify()
    try:
        click.echo("\n".join(p.describe()))
    except InputError:  # a table that cannot be read: its rows are among the problems
        click.echo(f"pack: {p.root}")
    if not problems:
        click.echo("verify: OK (every file matches MANIFEST.sha256, every table row reads)")
        return
    click.echo(f"verify: {len(problems)} problem{'s' if len(problems) > 1 else ''}")
    echo_lines(f"  {problem}" for problem in problems)
    raise SystemExit(1)


@click.command("scan")
@click.option("--images", type=DIR, required=True, help="Folder of films: MIMIC-CXR layout, or flat with --index.")
@click.option("--reports", type=EXISTING, default=None,
              help="Report folder (MIMIC-CXR layout), or one JSONL/CSV table with study_id and report columns.")
@click.option("--index", type=FILE, default=None,
              help="CSV/JSONL with image, study_id and report_path or report columns; optional subject_id, "
                   "dicom_id, view.")
@click.option("--metadata", type=FILE, default=None,
              help="View table (MIMIC-CXR-JPG's mimic-cxr-2.0.0-metadata.csv[.gz], or a CSV with dicom_id and "
                   "ViewPosition or view). Default: that file in the image folder or its parent, when there.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON line per image, per failure and per film the --index does not name.")
@click.option("--check", is_flag=True,
              help="Also read every image and report as ils build does and list those that fail (decodes every "
                   "film: slower).")
def scan(images: Path, reports: Path | None, index: Path | None, metadata: Path | None, as_json: bool,
         check: bool) -> None:
    """Count the studies (films + report) found in a folder and the views of their films, and list every file that
    cannot be used (without --check: what the file system shows; a corrupt film or an empty report needs --check)
    and every film an --index does not name; --json lists the studies too, one line per film. Exits 1 when the
    folder holds no film, or none of those found makes a usable study."""
    studies, failures = _scan_with_reports(images, reports, index)
    if check:
        from cxrground.datasets.folder import check_studies

        studies, unreadable = check_studies(studies, progress=not as_json)
        failures = [*failures, *unreadable]
    table, views = load_view_table(metadata, images)
    studies = [_header_view(image) for group in views_by_study(studies, views).values() for image in group]
    unlisted = films_not_in_index(index, images) if index is not None else []
    report_table = reports if reports is not None and not reports.is_dir() else None
    echo_lines(scan_lines(studies, failures, as_json=as_json, view_table=table, unlisted=unlisted,
                          report_table=report_table))
    if failures and not studies:
        raise click.ClickException(f"no usable study under {images}: all {len(failures)} found failed")


def _header_view(image: StudyInput) -> StudyInput:
    """``image`` with its view read from its DICOM header when it is a DICOM file and its view is still unknown
    (``ils build`` reads it there too)."""
    from dataclasses import replace

    from cxrground.io.dicom import dicom_view
    from cxrground.io.image import is_dicom

    if image.view is not None or not is_dicom(image.image_path):
        return image
    view = dicom_view(image.image_path)
    return image if view is None else replace(image, view=view)


def _scan_with_reports(images: Path, reports: Path | None, index: Path | None) -> tuple[list, list]:
    """:func:`scan_folder`, with ``reports`` a report folder or a table (as ``ils build`` reads it: a study the
    table has no report for is a failure, as is each unreadable table line)."""
    from cxrground.errors import Failure
    from cxrground.ils.tasks import report_table

    if reports is None or reports.is_dir():
        return scan_folder(images, reports, index)
    table, failures = report_table(reports)
    have = {key for key, text in table.items() if text}
    studies, bad = scan_folder(images, None, index, require_reports=False)
    kept = [s for s in studies if s.study_id in have]
    failures = [*failures, *bad, *(Failure(str(s.image_path), "scan", f"no report for {s.shown_id()} in {reports}",
                                           "InputError") for s in studies if s.study_id not in have)]
    return kept, failures


COMMANDS: list[click.Command] = [synth, synth_info, pack, scan]
