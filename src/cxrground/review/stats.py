"""Review statistics: acceptance per lesion and item type, Cohen's κ per reviewer pair, Fleiss' κ, mask Dice.

Pure functions first (unit-tested against hand-computed values), then :func:`review_stats` over a database: the
same figures from SQL aggregates in one read transaction (counts per reviewer, lesion, item type, reviewer pair and
unit), so its memory stays small whatever the number of assignments, payloads and masks.

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
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.io.masks import rle_overlap
from cxrground.review.db import ILS_PART

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
    if not a:
        return float("nan")
    return _cohen(len(a), sum(x == y for x, y in zip(a, b, strict=True)), Counter(a), Counter(b))


def _cohen(n: int, agreed: int, ca: Mapping[str, int], cb: Mapping[str, int]) -> float:
    """Cohen's κ from the number of shared units, how many got one same label, and each rater's label counts."""
    p_o = agreed / n
    p_e = sum(ca[c] * cb[c] for c in ca.keys() & cb.keys()) / (n * n)
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
    return _fleiss(p_i, table.sum(axis=0), n_i.sum())


def _fleiss(p_i: np.ndarray, per_category: np.ndarray, ratings: float) -> float:
    """Fleiss' κ from each unit's agreement ``P_i`` (unit order), the ratings per category and their total."""
    p_j = per_category / ratings
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
    return _acceptance(groups)


def _acceptance(groups: Mapping[str, Counter]) -> dict[str, dict[str, float]]:
    """The acceptance table of some decision counts per group name."""
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


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


#: The ratings: every decision with its assignment, item and reviewer (``d``, ``a``, ``i``, ``u``).
_RATINGS: Final[str] = ("decisions d JOIN assignments a ON a.id = d.assignment_id JOIN items i ON i.id = a.item_id "
                        "JOIN users u ON u.id = a.user_id")

#: Per reviewer: assignments, assignments done, units assigned and units decided; then one row with reviewer NULL:
#: the items in a queue and how many of them every assigned reviewer has done. An item's units are its parts as
#: :attr:`~cxrground.review.db.Item.parts` lists them (``payload.parts``, or the one ILS part when it has none);
#: SQLite reads each payload once and none of it reaches Python.
_PROGRESS_SQL: Final[str] = f"""
WITH parts(item_id, part, n) AS MATERIALIZED (
  SELECT i.id, COALESCE(j.value, '{ILS_PART}'), COUNT(*) FROM items i LEFT JOIN json_each(i.payload, '$.parts') j
  GROUP BY 1, 2),
item_units(item_id, units, distinct_parts) AS MATERIALIZED (
  SELECT item_id, SUM(n), COUNT(*) FROM parts GROUP BY item_id),
decided(assignment_id, units, distinct_parts) AS MATERIALIZED (
  SELECT d.assignment_id, SUM(p.n), COUNT(*) FROM decisions d JOIN assignments a ON a.id = d.assignment_id
  JOIN parts p ON p.item_id = a.item_id AND p.part = d.part GROUP BY d.assignment_id),
per_assignment(item_id, reviewer, units, decided, done) AS MATERIALIZED (
  SELECT a.item_id, u.name, n.units, COALESCE(x.units, 0), COALESCE(x.distinct_parts, 0) = n.distinct_parts
  FROM assignments a JOIN users u ON u.id = a.user_id JOIN item_units n ON n.item_id = a.item_id
  LEFT JOIN decided x ON x.assignment_id = a.id)
SELECT reviewer, COUNT(*), SUM(done), SUM(units), SUM(decided) FROM per_assignment GROUP BY reviewer
UNION ALL
SELECT NULL, COUNT(*), SUM(complete), 0, 0 FROM (SELECT MIN(done) AS complete FROM per_assignment GROUP BY item_id)
"""

#: Ratings per lesion, item type (an ILS pair's type and sign, a question's id), decision and reason.
_TALLY_SQL: Final[str] = (f"SELECT i.lesion, CASE WHEN i.kind = 'ils' THEN i.item_type ELSE d.part END, d.decision, "
                          f"d.reason, COUNT(*) FROM {_RATINGS} GROUP BY 1, 2, 3, 4")

#: Per reviewer pair (a < b) and pair of their decisions: the units (item key, part) both rated so (a reviewer rates
#: a unit once: an ILS pair and the benchmark case of the same key have different parts).
_AGREEMENT_SQL: Final[str] = f"""
WITH r AS MATERIALIZED (SELECT i.key, d.part, u.name AS reviewer, d.decision FROM {_RATINGS})
SELECT x.reviewer, y.reviewer, x.decision, y.decision, COUNT(*) FROM r x
JOIN r y ON y.key = x.key AND y.part = x.part AND y.reviewer > x.reviewer GROUP BY 1, 2, 3, 4
"""

#: Per unit with two or more ratings: ``P_i`` and its ratings per category, in the order :func:`fleiss_of` meets the
#: units when the assignments are read in queue order (so the mean of ``P_i`` is summed in the same order, to the
#: last bit): by first rating. A unit's raters are distinct users, so its first rating is its lowest user id's, and
#: ``a.position`` is that rating's (SQLite takes a bare column from the row that gave the one ``MIN``).
_UNITS_SQL: Final[str] = f"""
SELECT CAST(na * (na - 1) + nc * (nc - 1) + nr * (nr - 1) AS REAL) / (n * (n - 1)), na, nc, nr FROM (
  SELECT MIN(a.user_id) AS first_user, a.position AS position, d.part AS part, COUNT(*) AS n,
         SUM(d.decision = 'accept') AS na, SUM(d.decision = 'correct') AS nc, SUM(d.decision = 'reject') AS nr
  FROM {_RATINGS} GROUP BY i.key, d.part HAVING COUNT(*) >= 2)
ORDER BY first_user, position, part
"""

#: The corrected masks of ILS pairs with a generated one, queue order.
_CORRECTIONS_SQL: Final[str] = (f"SELECT i.lesion, i.height, i.width, d.mask, i.mask FROM {_RATINGS} "
                                f"WHERE i.kind = 'ils' AND d.part = '{ILS_PART}' AND d.decision = 'correct' "
                                "AND d.mask IS NOT NULL AND i.mask IS NOT NULL ORDER BY a.user_id, a.position")


def review_stats(db: Any) -> dict[str, Any]:
    """Everything the statistics page and ``review stats`` show, JSON-ready (NaN as None), from one read transaction
    of the database. The figures are SQL aggregates (counts per reviewer, per lesion, per reviewer pair, per unit):
    no item payload reaches Python, and a corrected mask is compared with the generated one by its runs, one pair
    at a time."""
    reviewers, tally, cohen = [], Counter(), []
    by_lesion: dict[str, Counter] = defaultdict(Counter)
    by_type: dict[str, Counter] = defaultdict(Counter)
    reasons: Counter = Counter()
    with db.connect(write=False) as con:
        items = con.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        for name, assigned, done, units, decided in con.execute(_PROGRESS_SQL):
            if name is None:
                items_complete = done or 0
            else:
                reviewers.append({"reviewer": name, "assigned": assigned, "done": done})
                tally["units"] += units
                tally["decided"] += decided
        for lesion, item_type, decision, reason, n in con.execute(_TALLY_SQL):
            by_lesion[lesion][decision] += n
            by_type[item_type][decision] += n
            tally["ratings"] += n
            if decision == "reject":
                reasons[reason] += n
        pairs: dict[tuple[str, str], Counter] = defaultdict(Counter)
        for a, b, x, y, n in con.execute(_AGREEMENT_SQL):
            pairs[a, b][x, y] += n
        p_i, per_category = array("d"), [0, 0, 0]
        for agreement, *counts in con.execute(_UNITS_SQL):
            p_i.append(agreement)
            per_category = [x + y for x, y in zip(per_category, counts, strict=True)]
        dice_rows: list[float] = []
        per_lesion: dict[str, list[float]] = defaultdict(list)
        for lesion, h, w, corrected, generated in con.execute(_CORRECTIONS_SQL):
            mine, theirs = json.loads(corrected), json.loads(generated)
            if not mine or not theirs:
                continue
            a_px, b_px, both = rle_overlap(mine, theirs, (h, w))
            value = 1.0 if a_px + b_px == 0 else 2.0 * both / (a_px + b_px)
            dice_rows.append(value)
            per_lesion[lesion].append(value)
    for (a, b), table in sorted(pairs.items()):
        n = sum(table.values())
        agreed = sum(v for (x, y), v in table.items() if x == y)
        ca, cb = Counter(), Counter()
        for (x, y), v in table.items():
            ca[x] += v
            cb[y] += v
        cohen.append({"a": a, "b": b, "shared": n, "agreement": agreed / n,
                      "kappa": _nan_to_none(_cohen(n, agreed, ca, cb))})
    fk = (_fleiss(np.frombuffer(p_i), np.asarray(per_category, float), float(sum(per_category))) if p_i
          else float("nan"))
    reviewers.sort(key=lambda r: r["reviewer"])
    return {
        "items": items, "items_complete": items_complete,
        "assignments": sum(r["assigned"] for r in reviewers), "units_assigned": tally["units"],
        "units_decided": tally["decided"], "ratings": tally["ratings"], "reviewers": reviewers,
        "acceptance_by_lesion": _acceptance(by_lesion),
        "acceptance_by_type": _acceptance(by_type),
        "reject_reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "cohen": cohen,
        "fleiss": {"kappa": _nan_to_none(fk), "units": len(p_i)},
        "dice": {"n": len(dice_rows),
                 "mean": float(np.mean(dice_rows)) if dice_rows else None,
                 "median": float(np.median(dice_rows)) if dice_rows else None,
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
