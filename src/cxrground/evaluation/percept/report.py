"""``percept report``: one self-contained HTML page comparing evaluation runs.

Tables (summary per path and setting with 95 % CIs, sub-tasks with chance / single-pick / majority
baselines, parse-label rates; for runs with several repeats, the spread across repeats: mean ± standard
deviation and [min, max] per stage, depth and sub-task) and inline SVG plots (per-stage accuracy by path,
depth distribution, sub-task bars, per-lesion End-to-End heatmap, unparseable rates, or a line saying that
every answer parsed). No scripts, no external URLs: it opens from ``file://``. Runs are scored first when their
``score.json`` is missing or older than the results.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from cxrground.evaluation.percept.conversation import ATTRIBUTE_QIDS, REVISION_QIDS
from cxrground.evaluation.percept.runner import CASES_FILE, CONFIG_FILE, RESULTS_FILE
from cxrground.evaluation.percept.scoring import (
    LABELS,
    PATH_ORDER,
    SCORE_FILE,
    read_config,
    read_plans,
    score_run,
    write_csvs,
)

__all__ = ["REPORT_CSV", "build_report", "has_results", "load_scores", "mixed_builds", "render_report", "write_report"]

#: The cross-run summary CSV written beside the report.
REPORT_CSV: Final[str] = "all_models_summary.csv"
_COLORS: Final[tuple[str, ...]] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                   "#7f7f7f", "#bcbd22", "#17becf")
_CSS: Final[str] = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 20px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}th{background:#f3f3f3}
td.l,th.l{text-align:left}svg{display:block;margin:6px 0 18px}h2{margin-top:28px}.legend span{margin-right:14px}
small{color:#666}p.warn{background:#fff3cd;border:1px solid #e0b84c;padding:6px 10px}
"""


def _usable(score: Any) -> bool:
    """Whether an earlier ``score.json`` holds what the report reads (else the run is scored again)."""
    return (isinstance(score, dict) and isinstance(score.get("run"), dict) and "label" in score["run"]
            and all(isinstance(score.get(k), dict) for k in ("paths", "subtasks", "per_lesion", "chance", "parse"))
            and all(isinstance(score.get(k), list) for k in ("failed_cases", "missing_cases")))


def has_results(run: str | Path) -> bool:
    """Whether the run folder ``run`` holds results (``results.jsonl``): a run stopped before its first case
    finished (a 401/403/404, an early kill) holds ``config.json`` and none. Its ``config.json`` must be valid
    (:func:`~.scoring.read_config`: an :class:`~cxrground.errors.InputError` naming the file)."""
    read_config(run)
    return (Path(run) / RESULTS_FILE).is_file()


def load_scores(runs: Sequence[str | Path], n_boot: int = 1000) -> list[dict[str, Any]]:
    """``score.json`` of every run (scored now when missing, older than the run's files or unreadable). Every run
    must hold a valid ``config.json`` and ``cases.json`` (:func:`~.scoring.read_config`,
    :func:`~.scoring.read_plans`: an :class:`~cxrground.errors.InputError` naming the file), even when its
    ``score.json`` is reused. Each score's ``run`` block gains ``folder``, the run folder as given (not saved)."""
    import json

    scores = []
    for run in runs:
        run = Path(run)
        read_config(run)
        read_plans(run)
        score_file = run / SCORE_FILE
        score: Any = None
        if score_file.is_file() and all(not f.is_file() or score_file.stat().st_mtime >= f.stat().st_mtime
                                        for f in (run / RESULTS_FILE, run / CONFIG_FILE, run / CASES_FILE)):
            try:
                score = json.loads(score_file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                score = None
        score = score if _usable(score) else score_run(run, n_boot=n_boot)
        score["run"]["folder"] = str(run)
        scores.append(score)
    return scores


def mixed_builds(scores: Sequence[dict[str, Any]]) -> str | None:
    """A warning naming the runs of each benchmark build when ``scores`` (:func:`load_scores`) come from runs
    evaluated on different builds (``bench_sha256`` of their ``config.json``); None when they share one. A run
    whose configuration records no ``bench_sha256`` is left out of the comparison."""
    builds: dict[str, list[dict[str, Any]]] = {}
    for s in scores:
        sha = (s["run"].get("config") or {}).get("bench_sha256")
        if isinstance(sha, str):
            builds.setdefault(sha, []).append(s["run"])
    if len(builds) < 2:
        return None
    parts = [f"build {sha[:12]} (bench {runs[0]['config'].get('bench', '?')}): "
             + ", ".join(f"{r.get('folder', r['label'])} ({r['label']})" for r in runs) for sha, runs in builds.items()]
    return (f"warning: the runs were evaluated on {len(builds)} different benchmark builds (bench_sha256 differs), so "
            f"their numbers are not comparable: {'; '.join(parts)}")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _ci(block: dict[str, Any]) -> str:
    ci = block.get("ci")
    return f"{_pct(block['acc'])} <small>[{_pct(ci[0])}, {_pct(ci[1])}]</small>" if ci else _pct(block.get("acc"))


def _spread(block: dict[str, Any], pct: bool = True) -> str:
    """``mean ± std [min, max]`` of a block with a ``spread`` (accuracy in %, or depth as is)."""
    sp = block.get("spread")
    if not sp:
        return "–"
    f = _pct if pct else (lambda x: f"{x:.2f}")
    scale = 100 if pct else 1
    return (f"{f(block['acc'])} ± {scale * sp['std']:.{1 if pct else 2}f} "
            f"<small>[{f(sp['min'])}, {f(sp['max'])}]</small>")


def _spread_section(scores: Sequence[dict[str, Any]]) -> str:
    """Tables of the spread across repeats (empty when no run has more than one repeat)."""
    multi = [s for s in scores if s.get("repeats", 1) > 1]
    if not multi:
        return ""
    rows = [[html.escape(s["run"]["label"]), path, setting, str(s["repeats"]),
             *(_spread(block[setting][f"stage{k}"]) for k in (1, 2, 3, 4)), _spread(block["depth"], pct=False)]
            for s in multi for path, block in s["paths"].items() for setting in ("end_to_end", "oracle_passed")]
    qids = (*REVISION_QIDS, *ATTRIBUTE_QIDS)
    sub = [[html.escape(s["run"]["label"]), str(s["repeats"]), *(_spread(s["subtasks"][q]) for q in qids)]
           for s in multi]
    return ("<h2>Spread across repeats (mean ± std, [min, max])</h2>"
            + _table(["run", "path", "setting", "repeats", "stage 1", "stage 2", "stage 3", "stage 4", "depth"],
                     rows, 3)
            + _table(["run", "repeats", *qids], sub, 1))


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _bars(groups: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], title: str,
          ymax: float = 1.0, fmt: str = "pct") -> str:
    """A grouped bar chart as inline SVG (one colour per series)."""
    n_s = max(1, len(series))
    bw, gap, h, left, top = 14, 18, 160, 40, 20
    longest = max((len(g) for g in groups), default=0)
    gw = max(n_s * bw + gap, 6 * longest + 10)  # room for the group label (about 6 px per 10-px character)
    width = left + len(groups) * gw + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + top + 60}" role="img">',
           f"<title>{html.escape(title)}</title>",
           f'<line x1="{left}" y1="{top + h}" x2="{width - 10}" y2="{top + h}" stroke="#333"/>']
    for t in (0.0, 0.5, 1.0):
        y = top + h - t * h
        label = f"{100 * t * ymax:.0f}%" if fmt == "pct" else f"{t * ymax:g}"
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{label}</text>')
    for g, name in enumerate(groups):
        x0 = left + g * gw + (gw - n_s * bw) / 2
        for s, (_, values) in enumerate(series):
            v = values[g]
            if v is None:
                continue
            bh = max(0.0, min(1.0, v / ymax)) * h
            out.append(f'<rect x="{x0 + s * bw:.1f}" y="{top + h - bh:.1f}" width="{bw - 2}" height="{bh:.1f}" '
                       f'fill="{_COLORS[s % len(_COLORS)]}"><title>{html.escape(series[s][0])} · '
                       f"{html.escape(name)}: {v:.3f}</title></rect>")
        out.append(f'<text x="{x0 + n_s * bw / 2:.1f}" y="{top + h + 14}" font-size="10" text-anchor="middle">'
                   f"{html.escape(name)}</text>")
    out.append("</svg>")
    return "".join(out)


def _legend(labels: Sequence[str]) -> str:
    items = "".join(f'<span><svg width="10" height="10" style="display:inline"><rect width="10" height="10" '
                    f'fill="{_COLORS[i % len(_COLORS)]}"/></svg> {html.escape(lab)}</span>'
                    for i, lab in enumerate(labels))
    return f'<div class="legend">{items}</div>'


def _heatmap(score: dict[str, Any]) -> str:
    """Per-lesion × (path, stage) End-to-End accuracy as coloured cells."""
    cols = [(p, s) for p in PATH_ORDER for s in (1, 2, 3, 4)
            if any(p in v and v[p]["end_to_end"].get(f"stage{s}") is not None for v in score["per_lesion"].values())]
    lesions = sorted(score["per_lesion"])
    cw, ch, left, top = 44, 20, 110, 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + cw * len(cols) + 10}" '
           f'height="{top + ch * len(lesions) + 10}" role="img"><title>per-lesion heatmap</title>']
    for j, (p, s) in enumerate(cols):
        out.append(f'<text x="{left + j * cw + cw / 2}" y="{top - 8}" font-size="10" text-anchor="middle">'
                   f"{p} S{s}</text>")
    for i, lesion in enumerate(lesions):
        out.append(f'<text x="{left - 6}" y="{top + i * ch + 14}" font-size="11" text-anchor="end">'
                   f"{html.escape(lesion)}</text>")
        for j, (p, s) in enumerate(cols):
            v = score["per_lesion"][lesion].get(p, {}).get("end_to_end", {}).get(f"stage{s}")
            fill = "#eee" if v is None else f"rgb({int(255 - 200 * v)},{int(120 + 100 * v)},{int(255 - 200 * v)})"
            text = "" if v is None else f"{100 * v:.0f}"
            out.append(f'<rect x="{left + j * cw}" y="{top + i * ch}" width="{cw - 1}" height="{ch - 1}" '
                       f'fill="{fill}"/><text x="{left + j * cw + cw / 2}" y="{top + i * ch + 14}" font-size="10" '
                       f'text-anchor="middle">{text}</text>')
    out.append("</svg>")
    return "".join(out)


def render_report(scores: Sequence[dict[str, Any]], title: str = "CheXpercept evaluation") -> str:
    """The HTML page for ``scores`` (one per run)."""
    labels = [s["run"]["label"] for s in scores]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>", _legend(labels)]
    mixed = mixed_builds(scores)
    if mixed:
        parts.append(f"<p class='warn'><b>Warning:</b> {html.escape(mixed.removeprefix('warning: '))}</p>")
    rows = []
    for s in scores:
        for path, block in s["paths"].items():
            for setting in ("end_to_end", "oracle_passed"):
                rows.append([html.escape(s["run"]["label"]), path, setting, str(block["n"]),
                             *(_ci(block[setting][f"stage{k}"]) for k in (1, 2, 3, 4)),
                             f"{block['depth']['mean']:.2f}"])
    parts.append("<h2>Summary (accuracy %, 95 % bootstrap CI)</h2>")
    parts.append(_table(["run", "path", "setting", "n", "stage 1", "stage 2", "stage 3", "stage 4", "depth"], rows, 3))
    if any(s.get("repeats", 1) > 1 for s in scores):
        parts.append(_spread_section(scores))
    parts.append("<h2>Per-stage accuracy by path (End-to-End)</h2>")
    groups = [f"{p} S{k}" for p in PATH_ORDER for k in (1, 2, 3, 4)
              if any(p in s["paths"] and s["paths"][p]["end_to_end"][f"stage{k}"]["acc"] is not None for s in scores)]
    series = [(s["run"]["label"], [s["paths"].get(g.split()[0], {}).get("end_to_end", {}).get(f"stage{g[-1]}", {})
                                   .get("acc") for g in groups]) for s in scores]
    parts.append(_bars(groups, series, "per-stage accuracy by path"))
    parts.append("<h2>Depth distribution (share of cases)</h2>")
    dgroups = [f"{p} d{d}" for p in PATH_ORDER for d in range(5) if any(p in s["paths"] for s in scores)
               and d <= {"RR": 4, "RF": 3, "LF": 1}[p]]
    dseries = []
    for s in scores:
        vals: list[float | None] = []
        for g in dgroups:
            p, d = g.split()
            block = s["paths"].get(p)
            vals.append(block["depth"]["distribution"][d[1:]] / block["n"] if block else None)
        dseries.append((s["run"]["label"], vals))
    parts.append(_bars(dgroups, dseries, "depth distribution"))
    qids = (*REVISION_QIDS, *ATTRIBUTE_QIDS)
    parts.append("<h2>Sub-task accuracy (Oracle-Passed)</h2>")
    parts.append(_bars(list(qids), [(s["run"]["label"], [s["subtasks"][q]["acc"] for q in qids]) for s in scores],
                       "sub-task accuracy"))
    sub_rows = []
    for s in scores:
        for q in qids:
            b = s["subtasks"][q]
            ch = [s["chance"]["questions"].get(q, {}).get(p) for p in b["paths"]]
            ch = [c for c in ch if c]
            tot = sum(c["n"] for c in ch) or 1
            mean = lambda k, ch=ch, tot=tot: sum(c[k] * c["n"] for c in ch) / tot if ch else None  # noqa: E731
            sub_rows.append([html.escape(s["run"]["label"]), q, "+".join(b["paths"]), str(b["n"]), _ci(b),
                             _pct(b["lenient_acc"]), _pct(mean("chance")), _pct(mean("single_pick")),
                             _pct(mean("majority"))])
    parts.append(_table(["run", "question", "paths", "n", "accuracy", "lenient", "chance", "single pick",
                         "majority"], sub_rows, 3))
    parts.append("<h2>Per-lesion End-to-End accuracy (%)</h2>")
    for s in scores:
        parts.append(f"<h3>{html.escape(s['run']['label'])}</h3>{_heatmap(s)}")
    parts.append("<h2>Parse labels</h2>")
    stages = [f"stage{k}" for k in (1, 2, 3, 4)]
    unparsed = [(s["run"]["label"], [s["parse"]["per_stage"][k]["unparseable"] for k in stages]) for s in scores]
    rates = [v for _label, values in unparsed for v in values if v is not None]
    if rates and not any(rates):  # nothing to draw: an empty chart would look broken
        parts.append("<p class='parsed'>All answers parsed (100 %): no answer of any run was unparseable at any "
                     "stage.</p>")
    else:
        parts.append(_bars(stages, unparsed, "unparseable rate by stage"))
    prow = [[html.escape(s["run"]["label"]), str(s["parse"]["overall"]["n"]),
             *(_pct(s["parse"]["overall"].get(k)) for k in LABELS),
             str(len(s["failed_cases"])), str(len(s.get("no_answer_cases", []))), str(s.get("cut_answers", 0)),
             str(len(s["missing_cases"])), str(len(s.get("bad_lines", [])))]
            for s in scores]
    parts.append(_table(["run", "answers", *(f"{k} %" for k in LABELS), "failed cases",
                         "of them: no answer from the server", "answers cut at max_tokens", "missing cases",
                         "unreadable result lines"], prow))
    bad = [f"<li>{html.escape(s['run']['label'])}: {html.escape(line)}</li>" for s in scores
           for line in s.get("bad_lines", [])]
    if bad:
        parts.append("<h3>Unreadable result lines (their cases count as failed where named)</h3><ul>"
                     + "".join(bad) + "</ul>")
    chance_rows = [[html.escape(s["run"]["label"]), p, setting,
                    *(_pct(v.get(f"stage{k}")) for k in (1, 2, 3, 4))]
                   for s in scores for p, b in s["chance"]["stages"].items() for setting, v in b.items()]
    parts.append("<h2>Chance per stage (uniform over valid answers, mean over items)</h2>")
    parts.append(_table(["run", "path", "view", "stage 1", "stage 2", "stage 3", "stage 4"], chance_rows, 3))
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(runs: Sequence[str | Path], out: str | Path, n_boot: int = 1000) -> Path:
    """Write the HTML report of ``runs`` to ``out`` and ``all_models_summary.csv`` next to it."""
    return write_report(load_scores(runs, n_boot=n_boot), out)


def write_report(scores: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """Write the HTML report of ``scores`` (:func:`load_scores`) to ``out`` and ``all_models_summary.csv`` next
    to it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(scores), encoding="utf-8")
    write_csvs(out.parent, scores, summary_name=REPORT_CSV)
    return out
