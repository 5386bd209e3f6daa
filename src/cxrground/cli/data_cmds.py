"""Commands on real data: the shared pack and a user's own folders."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from cxrground.datasets.folder import scan_folder
from cxrground.datasets.pack import Pack
from cxrground.errors import InputError


@click.group("pack")
def pack() -> None:
    """The shared real-data pack cxr-pack-v1 (read in place, never copied)."""


@pack.command("info")
@click.option("--path", "path", type=click.Path(path_type=Path), default=None,
              help="Pack folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@click.option("--verify", is_flag=True, help="Also check every file against MANIFEST.sha256.")
def pack_info(path: Path | None, verify: bool) -> None:
    """Print what the pack holds: images, masks, labels, licences, reports."""
    try:
        p = Pack(path)
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    nih, cohen = p.nih(), p.cohen()
    labels = Counter(lab for r in nih for lab in r.labels)
    click.echo(f"pack: {p.root}")
    click.echo(f"nih: {len(nih)} images, {sum(len(r.boxes) for r in nih)} boxes")
    click.echo("  labels: " + ", ".join(f"{k} {v}" for k, v in labels.most_common()))
    click.echo(f"cohen: {len(cohen)} images with right/left lung masks, "
               f"{sum(r.ignore_mask_path is not None for r in cohen)} ignore masks, "
               f"{sum(bool(r.notes) for r in cohen)} with notes, {sum(r.brixia is not None for r in cohen)} Brixia, "
               f"{sum(bool(r.severity) for r in cohen)} severity scores")
    click.echo("  licences: " + ", ".join(f"{k} {v}" for k, v in Counter(r.license for r in cohen).most_common()))
    click.echo(f"  shippable (may train shipped weights): {sum(r.shippable for r in cohen)}")
    click.echo(f"iu_reports: {len(p.iu_report_paths())} Open-i XML reports")
    if verify:
        bad = p.verify()
        click.echo("manifest: OK" if not bad else f"manifest: {len(bad)} files differ: {', '.join(bad[:10])}")
        if bad:
            raise SystemExit(1)


@click.command("scan")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@click.option("--reports", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None)
@click.option("--index", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="CSV/JSONL with image, study_id and report_path or report columns.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per study and per failure.")
def scan(images: Path, reports: Path | None, index: Path | None, as_json: bool) -> None:
    """List the studies (image + report) found in a folder and every file that could not be used."""
    try:
        studies, failures = scan_folder(images, reports, index)
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        for s in studies:
            click.echo(json.dumps({"study_id": s.study_id, "image": str(s.image_path),
                                   "report": str(s.report_path) if s.report_path else None}))
        for f in failures:
            click.echo(json.dumps({"failure": f.to_dict()}))
        return
    click.echo(f"{len(studies)} studies, {len(failures)} failures")
    for f in failures:
        click.echo(f"  failed: {f.path}: {f.reason}")


COMMANDS: list[click.Command] = [pack, scan]
