"""``cxrground review``: users, import, the review web app, statistics and export (logic in cxrground.review)."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import EXISTING, OUT_DIR, OUT_FILE, echo_lines, group, note, request_options, warn
from cxrground.net.limits import ConnectionLimits
from cxrground.review.db import MAX_SESSION_HOURS, SESSION_SECONDS
from cxrground.review.importers import ImportRequest, import_request

_DB = click.option("--db", "db_path", type=OUT_FILE, required=True,
                   help="The review database (SQLite; created by the first add-user).")


@group("review")
def review() -> None:
    """Expert review of ILS pairs and CheXpercept items: users, import, web app, statistics, export."""


@review.command("add-user")
@click.argument("name")
@_DB
@click.option("--role", type=click.Choice(["reviewer", "admin"]), default="reviewer",
              help="admin: sees every assignment and the statistics, and is given no items.")
def add_user(name: str, db_path: Path, role: str) -> None:
    """Create a user; prints the token once (last word of the last line); only its hash is stored."""
    from cxrground.review.db import ReviewDB

    user, token = ReviewDB.create(db_path).add_user(name, role)
    click.echo(f"created {user.role} {user.name} in {db_path}; the token is shown only now, keep it secret.")
    click.echo(f"token: {token}")


@review.command("import")
@_DB
@request_options(ImportRequest)
def import_cmd(request: ImportRequest, db_path: Path) -> None:
    """Load ILS pairs or CheXpercept cases and assign each to K reviewers (items already there are skipped)."""
    click.echo(import_request(db_path, request))


@review.command("serve")
@_DB
@click.option("--host", default="127.0.0.1",
              help="Address to bind; anything but loopback exposes the app to the network (use HTTPS in front).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, help="TCP port to listen on.")
@click.option("--secure-cookies", is_flag=True,
              help="Mark the session and login cookies Secure (the app sits behind HTTPS; browsers then send them "
                   "over HTTPS only).")
@click.option("--session-hours", type=click.FloatRange(0, MAX_SESSION_HOURS, min_open=True),
              default=SESSION_SECONDS / 3600, show_default=True,
              help="How long a sign-in lasts before the reviewer signs in again (more than 0, at most "
                   f"{MAX_SESSION_HOURS}).")
@request_options(ConnectionLimits)
def serve(connections: ConnectionLimits, db_path: Path, host: str, port: int, secure_cookies: bool,
          session_hours: float) -> None:
    """The review web app: /login, /queue, /review/ID, /stats and the /api (GET /healthz is public)."""
    from cxrground.review.launch import launch_app

    launch_app(db_path, host, port, warn=warn, note=note, secure_cookies=secure_cookies, connections=connections,
               session_hours=session_hours)


@review.command("unassign")
@_DB
@click.option("--reviewer", required=True, help="The reviewer whose assignments are removed.")
@click.option("--key", "keys", multiple=True,
              help="Remove the assignment of this item key ({lesion}_{pair_id}; repeatable).")
@click.option("--kind", type=click.Choice(["ils", "bench"]), default=None,
              help="With --key: only items of this kind (an ILS pair and the benchmark case built from it share a "
                   "key). Default: both.")
@click.option("--undecided", is_flag=True, help="Remove every assignment of the reviewer that has no decision yet.")
@click.option("--force", is_flag=True, help="Also remove assignments with decisions (their decisions leave the "
              "export and stay in `review history`, marked removed).")
def unassign(db_path: Path, reviewer: str, keys: tuple[str, ...], kind: str | None, undecided: bool,
             force: bool) -> None:
    """Take items out of a reviewer's queue, by --key or every --undecided one. An assignment with a decision is
    refused unless --force. Exit status: 0 removed, 1 nothing matched (or refused), 2 usage."""
    from cxrground.review.db import ReviewDB

    if bool(keys) == undecided:
        raise click.UsageError("give --key KEY (repeatable) or --undecided")
    if kind is not None and not keys:
        raise click.UsageError("--kind applies to --key only")
    db = ReviewDB(db_path)
    names = [u.name for u in db.users()]
    if reviewer not in names:
        raise click.BadParameter(f"no user {reviewer!r} in {db_path} (users: {', '.join(names) or 'none'})",
                                 param_hint="--reviewer")
    removed = db.unassign(reviewer, keys=keys, kind=kind, undecided=undecided, force=force)
    if not removed:
        what = f"key {', '.join(keys)}" + (f" ({kind})" if kind else "") if keys else "undecided item"
        raise click.ClickException(f"nothing removed: {reviewer} has no assignment of {what} in {db_path}")
    echo_lines([f"removed {reviewer}'s assignment of {r['kind']} {r['key']}"
                + (f" (decision of {', '.join(r['decided'])} kept in the history)" if r["decided"] else "")
                for r in removed] + [f"{len(removed)} assignment(s) removed from {db_path}"])


@review.command("relink")
@_DB
@click.option("--from", "old", default=None,
              help="The folder the images were imported from (as stored; it may no longer exist).")
@click.option("--to", "new", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The folder they are in now (the same relative paths below it).")
@click.option("--dry-run", is_flag=True, help="Count and check what would be rewritten; change nothing.")
@click.option("--allow-missing", is_flag=True,
              help="Rewrite even when some rewritten images are not files (the app answers 404 for those).")
def relink_cmd(db_path: Path, old: str | None, new: Path | None, dry_run: bool, allow_missing: bool) -> None:
    """Point the database at images that moved: stored paths under --from become the same paths under --to (one
    transaction, after checking the new files exist). Without --from and --to: list where the images are stored."""
    from cxrground.review.db import ReviewDB
    from cxrground.review.relink import relink, stored_roots

    db = ReviewDB(db_path)
    if old is None and new is None:
        roots = stored_roots(db, limit=20)
        echo_lines([f"{n:>7} image(s) in {root}" for root, n in roots] or [f"{db_path} holds no items"])
        return
    if old is None or new is None:
        raise click.UsageError("give both --from and --to (or neither, to list where the images are stored)")
    echo_lines(relink(db, old, new, dry_run=dry_run, allow_missing=allow_missing).lines(old, str(new)))


@review.command("stats")
@_DB
@click.option("--html", "html_path", type=OUT_FILE, default=None,
              help="Also write the statistics page (self-contained HTML).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def stats(db_path: Path, html_path: Path | None, as_json: bool) -> None:
    """Acceptance per lesion and item type, Cohen's and Fleiss' kappa, Dice of corrected vs generated masks."""
    from cxrground.review.stats import stats_report

    echo_lines(stats_report(db_path, html_path, as_json))


@review.command("export")
@_DB
@click.option("--out", type=OUT_FILE, required=True,
              help="decisions.csv (key_id,decision,reviewer,...: what `percept build --review` reads).")
@click.option("--masks", "masks_dir", type=OUT_DIR, default=None,
              help="Write corrected masks (PNG + masks.jsonl) and candidates.jsonl for `percept build --candidates`.")
@click.option("--card", "card_dir", type=EXISTING, default=None,
              help="An imported ILS dataset folder (or its JSON file): write the folder's review.json and the card's "
                   "review section.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file and a non-empty --masks folder (the "
              "folder as a whole: it is refused if it holds files other than an earlier export's).")
def export(db_path: Path, out: Path, masks_dir: Path | None, card_dir: Path | None, overwrite: bool) -> None:
    """Export consensus decisions (and corrected masks, and the ILS card's review figures). An existing --out or a
    non-empty --masks folder is refused unless --overwrite."""
    from cxrground.review.db import ReviewDB
    from cxrground.review.export import export_review

    echo_lines(export_review(ReviewDB(db_path), out, masks_dir, card_dir, overwrite=overwrite))


@review.command("history")
@_DB
@click.option("--key", default=None, help="Only this item key ({lesion}_{pair_id}).")
@click.option("--reviewer", default=None, help="Only this reviewer's decisions.")
@click.option("--out", type=OUT_FILE, default=None,
              help="Write JSON Lines (one object per write, with its mask as COCO RLE) instead of printing a table.")
def history(db_path: Path, key: str | None, reviewer: str | None, out: Path | None) -> None:
    """Every decision ever written, oldest first, replaced ones included (a decision overwritten from another tab or
    session can be read back here; `export` exports the latest)."""
    from cxrground.review.db import ReviewDB
    from cxrground.review.history import history_lines, write_history

    db = ReviewDB(db_path)
    echo_lines([write_history(db, out, key=key, reviewer=reviewer)] if out else
               history_lines(db, key=key, reviewer=reviewer))


COMMANDS: list[click.Command] = [review]
