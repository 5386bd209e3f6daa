"""Point a review database at images that moved: the stored absolute paths under one folder are rewritten to the
same relative paths under another, in one transaction, after checking that every rewritten image is a file."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from cxrground.errors import ConfigError
from cxrground.review.db import ReviewDB

__all__ = ["Relink", "relink", "stored_roots"]

#: How many missing images a refusal names.
_SHOWN: int = 3


@dataclass(frozen=True)
class Relink:
    """What :func:`relink` rewrote (or, for a dry run, would rewrite)."""

    items: int
    """Items with at least one path rewritten."""
    images: int
    """Image paths rewritten."""
    sources: int
    """Item sources (the imported dataset file or benchmark folder) rewritten."""
    untouched: int
    """Image paths not under the old folder, left as they are."""
    missing: list[str] = field(default_factory=list)
    """The distinct rewritten image paths that are not files (written only with ``allow_missing``)."""
    dry_run: bool = False

    def lines(self, old: str, new: str) -> list[str]:
        """The summary a user reads."""
        verb = "would rewrite" if self.dry_run else "rewrote"
        out = [f"{verb} {self.images} image path(s) and {self.sources} source(s) of {self.items} item(s) from "
               f"{old} to {new}; {self.untouched} image path(s) lie elsewhere and are left as they are"]
        if self.missing:
            out.append(f"{len(self.missing)} rewritten image file(s) are missing (first: {self.missing[0]}); the app "
                       "answers 404 for them")
        if self.dry_run:
            out.append("dry run: nothing was changed")
        return out


def _under(stored: str, old: PurePath) -> PurePath | None:
    """``stored`` relative to ``old``, or None when it does not lie under it."""
    try:
        return PurePath(stored).relative_to(old)
    except ValueError:
        return None


def stored_roots(db: ReviewDB, limit: int = 5) -> list[tuple[str, int]]:
    """The folders holding the stored images, most images first: ``[(folder, images)]`` (at most ``limit``)."""
    with db.connect(write=False) as con:
        return _roots([r[0] for r in con.execute("SELECT images FROM items")], limit)


def _roots(images_columns: list[str], limit: int) -> list[tuple[str, int]]:
    roots: Counter[str] = Counter()
    for images in images_columns:
        for im in json.loads(images):
            roots[str(PurePath(im["path"]).parent)] += 1
    return roots.most_common(limit)


def relink(db: ReviewDB, old: str | Path, new: str | Path, *, dry_run: bool = False,
           allow_missing: bool = False) -> Relink:
    """Rewrite every stored image path and item source under ``old`` to the same relative path under ``new`` (an
    existing folder). Nothing stored under ``old`` is a :class:`ConfigError` naming where the images are; rewritten
    images that are not files are one too (nothing changes) unless ``allow_missing``. Decisions, users and
    assignments are not touched."""
    old_root, new_dir = Path(old).resolve(), Path(new).resolve()  # imports stored resolved paths
    if not new_dir.is_dir():
        raise ConfigError(f"--to {new}: not a folder")
    with db.connect(write=not dry_run) as con:
        rows = con.execute("SELECT id, source, images FROM items ORDER BY id").fetchall()
        updates: list[tuple[str, str, int]] = []
        images = sources = untouched = 0
        missing: list[str] = []
        for row in rows:
            stored = json.loads(row["images"])
            changed = False
            for im in stored:
                rel = _under(im["path"], old_root)
                if rel is None:
                    untouched += 1
                    continue
                target = new_dir / rel
                if str(target) not in missing and not target.is_file():
                    missing.append(str(target))
                im["path"], changed, images = str(target), True, images + 1
            source, rel = row["source"], _under(row["source"], old_root)
            if rel is not None:
                source, changed, sources = str(new_dir / rel), True, sources + 1
            if changed:
                updates.append((json.dumps(stored), source, row["id"]))
        if not updates:
            roots = ", ".join(f"{root} ({n})" for root, n in _roots([r["images"] for r in rows], 5)) or "none"
            raise ConfigError(f"no stored image or source lies under --from {old_root}; images are stored under: "
                              f"{roots}")
        if missing and not allow_missing:
            shown = "; ".join(missing[:_SHOWN])
            raise ConfigError(f"{len(missing)} image file(s) named by the {images} rewritten path(s) are not under "
                              f"--to {new_dir} (first: {shown}); nothing was changed (check --to, or pass "
                              "--allow-missing)")
        if not dry_run:
            con.executemany("UPDATE items SET images = ?, source = ? WHERE id = ?", updates)
    return Relink(len(updates), images, sources, untouched, missing, dry_run)
