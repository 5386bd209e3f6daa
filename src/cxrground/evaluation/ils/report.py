"""The Markdown report of an ILS evaluation result (:func:`format_report`, values in %)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_report"]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def format_report(result: dict[str, Any]) -> str:
    """A Markdown report of :func:`evaluate_dataset`'s result (values in %)."""
    seg, txt = result["segmentation"], result["text"]
    lines = [
        f"# ILS evaluation — split `{result['split']}`",
        "",
        f"- dataset: `{result['dataset']}`",
        f"- predictions: `{result['predictions']}`",
        f"- evaluated pairs: {result['n_pairs']}"
        + (f" (limited to the first {result['limit']})" if result.get("limit") is not None else " (full split)"),
        f"- segmentation mode: {result.get('seg_mode', 'unspecified')}",
        f"- GT mask frame: {result.get('mask_frame', 'native')} (scored at each image's native size)",
        f"- missing predictions (counted wrong): {len(result['missing'])}; without mask: "
        f"{len(result['missing_mask'])}; without answer: {len(result['missing_answer'])}",
        "",
        "## Pairs per bucket",
        "",
        "| type | positive | negative |",
        "|---|---:|---:|",
    ]
    lines += [f"| {t} | {c['positive']} | {c['negative']} |" for t, c in result["counts"].items()]
    ci = seg["ci"]
    lines += [
        "",
        f"## Segmentation (native resolution; 95 % bootstrap CI, {seg['n_boot']} resamples)",
        "",
        "| gIoU | cIoU | N-Acc | Dice | false-empty | positives | negatives |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {_pct(seg['gIoU'])}{_ci(ci['gIoU'])} | {_pct(seg['cIoU'])}{_ci(ci['cIoU'])} | "
        f"{_pct(seg['N-Acc'])}{_ci(ci['N-Acc'])} | {_pct(seg['Dice'])} | {_pct(seg['false_empty_ratio'])} | "
        f"{seg['n_positive']} | {seg['n_negative']} |",
        "",
        "### Per lesion (JSON `target`)",
        "",
        "| lesion | gIoU | cIoU | N-Acc | Dice | false-empty | pos | neg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in seg["per_lesion"].items():
        p, n = v["positive"], v["negative"]
        lines.append(f"| {name} | {_pct(p['gIoU'])} | {_pct(p['cIoU'])} | {_pct(n['N-Acc'])} | {_pct(p['Dice'])} | "
                     f"{_pct(p['false_empty_ratio'])} | {p['n']} | {n['n']} |")
    lines += ["", "### Per type", "", "| type | gIoU | cIoU | N-Acc | pos | neg |", "|---|---:|---:|---:|---:|---:|"]
    for name, v in seg["per_type"].items():
        p, n = v["positive"], v["negative"]
        lines.append(f"| {name} | {_pct(p['gIoU'])} | {_pct(p['cIoU'])} | {_pct(n['N-Acc'])} | {p['n']} | {n['n']} |")
    lines += [
        "",
        "## Text accuracy (§15.2)",
        "",
        f"Total (headline: lesion-inference lesion-only, global exact): {_pct(txt['total']['accuracy'])} "
        f"({txt['total']['correct']}/{txt['total']['n']}); strict: {_pct(txt['total_strict']['accuracy'])}; "
        f"lenient: {_pct(txt['total_lenient']['accuracy'])}",
        "",
        "| type | positive | negative | overall | variant |",
        "|---|---:|---:|---:|---|",
    ]
    for name, v in txt["per_type"].items():
        p = v["positive"]
        variant = ""
        if "accuracy_strict" in p:
            variant = f"positive strict (lesion + certainty): {_pct(p['accuracy_strict'])}"
        if "accuracy_lenient" in p:
            variant = f"positive lenient (side): {_pct(p['accuracy_lenient'])}"
        if "accuracy_unordered" in p:
            variant += f"; labels in any order: {_pct(p['accuracy_unordered'])}"
        lines.append(f"| {name} | {_pct(p['accuracy'])} (n={p['n']}) | {_pct(v['negative']['accuracy'])} "
                     f"(n={v['negative']['n']}) | {_pct(v['overall']['accuracy'])} | {variant} |")
    types = list(txt["per_type"])
    lines += ["", "### Text accuracy per lesion", "", "| lesion | overall | " + " | ".join(types) + " |",
              "|---|---:|" + "---:|" * len(types)]
    for name, v in txt["per_lesion"].items():
        cells = [_pct(v[t]["accuracy"]) if t in v else "–" for t in types]
        lines.append(f"| {name} | {_pct(v['overall']['accuracy'])} | " + " | ".join(cells) + " |")
    if result["missing"]:
        shown = ", ".join(f"`{p}`" for p in result["missing"][:50])
        more = f" … and {len(result['missing']) - 50} more" if len(result["missing"]) > 50 else ""
        lines += ["", "## Missing predictions", "", shown + more]
    return "\n".join(lines) + "\n"
