"""Review statistics: acceptance per lesion and item type, Cohen's κ per reviewer pair, Fleiss' κ, mask Dice.

Pure functions first (unit-tested against hand-computed values), then :func:`review_stats` over a database.

* A **rating** is one reviewer's decision on one *unit* (an ILS pair, or one question of a CheXpercept case).
  Categories are ``accept``, ``correct`` (the pair is kept with the reviewer's mask) and ``reject``.
* **Acceptance** is the share of ratings that keep the unit (``accept`` or ``correct``); the corrected share is
  given beside it. The *item type* of an ILS pair is its pair type and sign (``global positive``), of a benchmark
  unit the question id (``contour_eval``).
* **Cohen's κ** (two raters): ``(p_o - p_e) / (1 - p_e)`` over the units both rated; NaN when ``p_e = 1`` (both
  gave one same category throughout: agreement is perfect but κ is undefined).
* **Fleiss' κ** over the units with at least two ratings, with the usual generalisation to a varying number of
  raters per unit (``P_i = Σ_j n_ij (n_ij - 1) / (n_i (n_i - 1))``, ``p_j = Σ_i n_ij / Σ_i n_i``); with a constant
  number of raters it is Fleiss (1971) exactly. NaN when ``P_e = 1`` or no unit has two ratings.
* **Consensus** of a unit: ``accept`` when a strict majority of its ratings keep it, ``reject`` otherwise, blank
  without ratings (a tie rejects: a benchmark item one expert of two rejected is not taken). The export takes it
  only for an item every assigned reviewer has decided in full (a *complete* item); until then the item is
  undecided.
* **Dice** between a corrected mask and the generated one: ``2|A∩B| / (|A|+|B|)``, 1 when both are empty.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.io.masks import decode_rle

__all__ = [
    "CATEGORIES",
    "Rating",
    "acceptance_table",
    "cohen_kappa",
    "consensus",
    "dice",
    "fleiss_kappa",
    "fleiss_of",
    "format_stats",
    "pairwise_cohen",
    "ratings_of",
    "review_stats",
    "stats_html",
    "stats_page",
    "stats_report",
]

CATEGORIES: tuple[str, str, str] = ("accept", "correct", "reject")
_KEEP = frozenset({"accept", "correct"})


@dataclass(frozen=True)
class Rating:
    """One reviewer's decision on one unit ``(key, part)``."""

    key: str
    part: str
    kind: str
    lesion: str
    item_type: str
    reviewer: str
    decision: str
    reason: str = ""

    @property
    def unit(self) -> tuple[str, str]:
        """``(item key, part)``."""
        return self.key, self.part


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's κ of two raters' labels on the same units (same order)."""
    if len(a) != len(b):
        raise ValueError(f"rater label lists differ in length: {len(a)} vs {len(b)}")
    n = len(a)
    if n == 0:
        return float("nan")
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[c] * cb[c] for c in set(ca) | set(cb)) / (n * n)
    return float("nan") if math.isclose(p_e, 1.0) else (p_o - p_e) / (1.0 - p_e)


def fleiss_kappa(counts: Sequence[Sequence[int]] | np.ndarray) -> float:
    """Fleiss' κ of a units × categories count table (rows with fewer than two ratings are left out)."""
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2:
        raise ValueError(f"expected a 2-D units × categories table, got shape {table.shape}")
    n_i = table.sum(axis=1)
    table, n_i = table[n_i >= 2], n_i[n_i >= 2]
    if len(table) == 0:
        return float("nan")
    p_i = (table * (table - 1)).sum(axis=1) / (n_i * (n_i - 1))
    p_j = table.sum(axis=0) / n_i.sum()
    p_bar, p_e = float(p_i.mean()), float((p_j**2).sum())
    return float("nan") if math.isclose(p_e, 1.0) else (p_bar - p_e) / (1.0 - p_e)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two same-shape boolean masks (1 when both are empty)."""
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int((a & b).sum()) / total


def consensus(decisions: Iterable[str]) -> str:
    """``accept`` (strict majority keeps), ``reject`` (otherwise) or ``""`` (no decision)."""
    ds = list(decisions)
    if not ds:
        return ""
    return "accept" if sum(d in _KEEP for d in ds) * 2 > len(ds) else "reject"


def acceptance_table(ratings: Iterable[Rating], by: str) -> dict[str, dict[str, float]]:
    """Per value of ``by`` (``lesion`` or ``item_type``): ratings, kept, corrected, rejected, acceptance."""
    groups: dict[str, Counter] = defaultdict(Counter)
    for r in ratings:
        name = getattr(r, by) if by != "item_type" or r.kind == "ils" else r.part
        groups[name][r.decision] += 1
    out = {}
    for name in sorted(groups):
        c = groups[name]
        n = sum(c.values())
        out[name] = {"ratings": n, "accepted": c["accept"], "corrected": c["correct"], "rejected": c["reject"],
                     "acceptance": (c["accept"] + c["correct"]) / n}
    return out


def pairwise_cohen(ratings: Iterable[Rating]) -> list[dict[str, Any]]:
    """Cohen's κ for every reviewer pair with shared units: ``{a, b, shared, agreement, kappa}``."""
    by_rater: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
    for r in ratings:
        by_rater[r.reviewer][r.unit] = r.decision
    out = []
    for a, b in itertools.combinations(sorted(by_rater), 2):
        shared = sorted(set(by_rater[a]) & set(by_rater[b]))
        if not shared:
            continue
        la, lb = [by_rater[a][u] for u in shared], [by_rater[b][u] for u in shared]
        out.append({"a": a, "b": b, "shared": len(shared),
                    "agreement": sum(x == y for x, y in zip(la, lb, strict=True)) / len(shared),
                    "kappa": cohen_kappa(la, lb)})
    return out


def fleiss_of(ratings: Iterable[Rating]) -> tuple[float, int]:
    """Fleiss' κ of some ratings over their units with two or more ratings, and the number of those units."""
    units: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in ratings:
        units[r.unit][r.decision] += 1
    rows = [[c[k] for k in CATEGORIES] for c in units.values() if sum(c.values()) >= 2]
    return (fleiss_kappa(rows), len(rows)) if rows else (float("nan"), 0)


def ratings_of(assignments: Iterable[Any]) -> list[Rating]:
    """Every decision of some :class:`~cxrground.review.db.Assignment` records as :class:`Rating` records."""
    return [Rating(a.item.key, part, a.item.kind, a.item.lesion, a.item.item_type, a.user_name, d["decision"],
                   d["reason"])
            for a in assignments for part, d in sorted(a.decisions.items())]


def _dice_rows(assignments: Iterable[Any]) -> list[dict[str, Any]]:
    rows = []
    for a in assignments:
        d = a.decisions.get("pair")
        if a.item.kind != "ils" or d is None or d["decision"] != "correct" or not d["mask"] or not a.item.mask:
            continue
        shape = (a.item.height, a.item.width)
        rows.append({"key": a.item.key, "lesion": a.item.lesion, "reviewer": a.user_name,
                     "dice": dice(decode_rle(d["mask"], shape), decode_rle(a.item.mask, shape))})
    return rows


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def review_stats(db: Any) -> dict[str, Any]:
    """Everything the statistics page and ``review stats`` show, JSON-ready (NaN as None), from one read of the
    database."""
    snap = db.snapshot()
    assignments = snap.assignments
    ratings = ratings_of(assignments)
    by_item: dict[int, list[bool]] = defaultdict(list)
    for a in assignments:
        by_item[a.item.id].append(a.done)
    units_total = sum(len(a.item.parts) for a in assignments)
    units_done = sum(len([p for p in a.item.parts if p in a.decisions]) for a in assignments)
    fk, fk_units = fleiss_of(ratings)
    dice_rows = _dice_rows(assignments)
    per_lesion: dict[str, list[float]] = defaultdict(list)
    for row in dice_rows:
        per_lesion[row["lesion"]].append(row["dice"])
    reviewers = []
    for name in sorted({a.user_name for a in assignments}):
        mine = [a for a in assignments if a.user_name == name]
        reviewers.append({"reviewer": name, "assigned": len(mine), "done": sum(a.done for a in mine)})
    reasons = Counter(r.reason for r in ratings if r.decision == "reject")
    return {
        "items": len(snap.items), "items_complete": sum(all(done) for done in by_item.values()),
        "assignments": len(assignments), "units_assigned": units_total,
        "units_decided": units_done, "ratings": len(ratings), "reviewers": reviewers,
        "acceptance_by_lesion": acceptance_table(ratings, "lesion"),
        "acceptance_by_type": acceptance_table(ratings, "item_type"),
        "reject_reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "cohen": [{**p, "kappa": _nan_to_none(p["kappa"])} for p in pairwise_cohen(ratings)],
        "fleiss": {"kappa": _nan_to_none(fk), "units": fk_units},
        "dice": {"n": len(dice_rows),
                 "mean": float(np.mean([r["dice"] for r in dice_rows])) if dice_rows else None,
                 "median": float(np.median([r["dice"] for r in dice_rows])) if dice_rows else None,
                 "by_lesion": {k: {"n": len(v), "mean": float(np.mean(v))} for k, v in sorted(per_lesion.items())}},
    }


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _tables(stats: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, shared by the text and HTML renderings."""
    def acc_rows(table: Mapping[str, Mapping[str, float]]) -> list[list[str]]:
        return [[k, str(v["ratings"]), str(v["accepted"]), str(v["corrected"]), str(v["rejected"]),
                 f"{100 * v['acceptance']:.1f}"] for k, v in table.items()]

    acc_head = ["ratings", "accepted", "corrected", "rejected", "acceptance %"]
    dice_stats = stats["dice"]
    return [
        ("Progress per reviewer", ["reviewer", "assigned", "done"],
         [[r["reviewer"], str(r["assigned"]), str(r["done"])] for r in stats["reviewers"]]),
        ("Acceptance per lesion", ["lesion", *acc_head], acc_rows(stats["acceptance_by_lesion"])),
        ("Acceptance per item type", ["item type", *acc_head], acc_rows(stats["acceptance_by_type"])),
        ("Rejection reasons", ["reason", "ratings"], [[k or "(none)", str(v)] for k, v in
                                                      stats["reject_reasons"].items()]),
        ("Cohen's kappa per reviewer pair (shared units)", ["reviewer A", "reviewer B", "shared", "agreement %",
                                                            "kappa"],
         [[p["a"], p["b"], str(p["shared"]), f"{100 * p['agreement']:.1f}", _num(p["kappa"])]
          for p in stats["cohen"]]),
        ("Fleiss' kappa (units with two or more ratings)", ["units", "kappa"],
         [[str(stats["fleiss"]["units"]), _num(stats["fleiss"]["kappa"])]]),
        ("Dice, corrected vs generated masks", ["lesion", "corrections", "mean Dice"],
         [*([k, str(v["n"]), _num(v["mean"])] for k, v in dice_stats["by_lesion"].items()),
          ["all", str(dice_stats["n"]), _num(dice_stats["mean"])]]),
    ]


def _complete(stats: Mapping[str, Any]) -> str:
    """How many items every assigned reviewer has decided in full (the ones an export gives a consensus)."""
    return f"{stats['items_complete']} decided by all their reviewers"


def format_stats(stats: Mapping[str, Any]) -> str:
    """Plain-text tables for the terminal."""
    lines = [f"{stats['items']} items ({_complete(stats)}), {stats['assignments']} assignments, "
             f"{stats['units_decided']} of "
             f"{stats['units_assigned']} assigned units decided, {stats['ratings']} ratings", ""]
    for title, head, rows in _tables(stats):
        widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)] if rows else \
            [len(h) for h in head]
        lines += [title, "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows] or ["(none)"]
        lines.append("")
    return "\n".join(lines)


def stats_html(stats: Mapping[str, Any]) -> str:
    """The statistics as an HTML fragment (tables with ids), for the web page and ``review stats --html``."""
    parts = [f"<p id='summary'>{stats['items']} items ({_complete(stats)}), {stats['assignments']} assignments, "
             f"{stats['units_decided']} of {stats['units_assigned']} assigned units decided, "
             f"{stats['ratings']} ratings.</p>"]
    ids = ["progress", "by-lesion", "by-type", "reasons", "cohen", "fleiss", "dice"]
    for tid, (title, head, rows) in zip(ids, _tables(stats), strict=True):
        parts.append(f"<h2>{html.escape(title)}</h2><table id='{tid}'><thead><tr>"
                     + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</tbody></table>")
    return "\n".join(parts)


_PAGE_CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:1rem auto;padding:0 1rem}"
             "table{border-collapse:collapse;margin:.4rem 0}td,th{padding:.2rem .6rem;border-bottom:1px solid #ccc;"
             "text-align:left}h2{font-size:1.05rem;margin-top:1.2rem}")


def stats_page(stats: Mapping[str, Any], title: str = "Review statistics") -> str:
    """A self-contained HTML document of the statistics (``review stats --html``)."""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_PAGE_CSS}</style></head><body><h1>{html.escape(title)}</h1>{stats_html(stats)}</body></html>\n")


def stats_report(db_path: Path, html_path: Path | None = None, as_json: bool = False) -> Iterator[str]:
    """The statistics of the review database at ``db_path`` as text (tables, or JSON with ``as_json``), then, with
    ``html_path``, the statistics page written there and a line saying so (lines are produced in that order)."""
    from cxrground.review.db import ReviewDB

    figures = review_stats(ReviewDB(db_path))
    yield json.dumps(figures, indent=2) if as_json else format_stats(figures)
    if html_path is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(stats_page(figures), encoding="utf-8")
        yield f"statistics page: {html_path}"
