"""The decision history of a review database: every decision ever written, replaced ones included, as a table for
the terminal or as JSON Lines (with each decision's mask) to recover a decision that was overwritten.

A write that replaced a decision made since its page loaded (another tab or session) only with the reviewer's
explicit consent is flagged ``overwrite``; ``latest`` marks the rows that are a part's decision now (what ``review
export`` exports); a write that changed only the comment is shown as a comment edit; the decisions of an assignment
removed with ``review unassign --force`` stay, marked with when it was removed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cxrground.review.db import ReviewDB

__all__ = ["history_lines", "write_history"]


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def history_lines(db: ReviewDB, *, key: str | None = None, reviewer: str | None = None) -> list[str]:
    """One line per write, oldest first: when, reviewer, item, part, decision (reason, mask; a write that changed
    only the comment says so), version, whether it replaced a decision made meanwhile, is the part's decision now or
    belongs to an assignment removed since, and the reviewer's comment (quoted as a JSON string, so a comment's line
    breaks stay on its line)."""
    rows = db.history(key=key, user=reviewer)
    if not rows:
        return ["no decisions recorded" + (f" for key {key}" if key else "") +
                (f" by {reviewer}" if reviewer else "")]
    out = []
    for r in rows:
        what = r["decision"] + (f" ({r['reason']})" if r["reason"] else "") + (" with a mask" if r["mask"] else "")
        if r["comment_only"]:
            what = f"comment edited ({what} kept)"
        notes = [f"v{r['version']}"]
        if r["replaced_version"]:
            notes.append(f"replaced v{r['replaced_version']}" + (" decided meanwhile (overwrite)" if r["overwrite"]
                                                                else ""))
        if r["latest"]:
            notes.append("latest")
        if r["removed"]:
            notes.append(f"assignment removed {_when(r['removed'])}")
        out.append(f"{_when(r['at'])}  {r['reviewer']}  {r['kind']} {r['key']} [{r['part']}]  {what}  "
                   f"{', '.join(notes)}" + (f"  comment: {json.dumps(r['comment'], ensure_ascii=False)}"
                                            if r["comment"] else ""))
    return out


def write_history(db: ReviewDB, out: str | Path, *, key: str | None = None, reviewer: str | None = None) -> str:
    """Write the history as JSON Lines to ``out`` (one object per write, its mask as COCO RLE); returns a summary."""
    rows = db.history(key=key, user=reviewer)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in rows:
            row: dict[str, Any] = {"time": _when(r["at"]), **r}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    replaced = sum(not r["latest"] for r in rows)
    return f"wrote {len(rows)} decision(s) to {path} ({replaced} replaced by a later one)"
