"""``cxrground percept export --format lmms-eval OUT``: CheXpercept as lmms-eval tasks.

``OUT`` holds the Hugging Face export of the benchmark (``data/``, ``README.md``; :mod:`.export_hf`) and the task
files lmms-eval reads with ``--include_path OUT``:

- ``{name}_none.yaml``, ``{name}_implicit.yaml``, ``{name}_explicit.yaml``: one task per oracle setting
  (§13.3), each the whole sequential conversation of every case as lmms-eval multi-round generation
  (``generate_until_multi_round``), greedy decoding with the harness's token budget (8192 new tokens);
- ``{name}.yaml``: the group of the three;
- ``utils.py``: thin bindings to :mod:`cxrground.evaluation.percept.lmms`, which replays the harness's own
  conversation, parser and scorer (so cxrground must be importable where lmms-eval runs).

The YAML files name the Parquet shards by absolute path (lmms-eval loads them with ``datasets``), so a moved
folder is exported again. The writer only writes text; it imports nothing of lmms-eval.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.io.export_dir import export_folder
from cxrground.io.hf import DATA_DIR, HF_NAMES
from cxrground.percept.export_hf import SPLIT, load_for_export, write_hf

__all__ = ["LMMS_NAMES", "METRICS", "ORACLES", "export_lmms_task", "task_yaml", "utils_source"]

#: The oracle settings of §13.3, one task each (the names of :data:`cxrground.evaluation.percept.conversation
#: .ORACLE_SETTINGS`, repeated here because this stage may not import the evaluation stage).
ORACLES: Final[tuple[str, ...]] = ("none", "implicit", "explicit")
#: The harness's default completion budget (``percept eval --max-tokens``).
MAX_NEW_TOKENS: Final[int] = 8192
#: The task's metrics (computed by :mod:`cxrground.evaluation.percept.lmms`, §15): End-to-End (``e2e``) and
#: Oracle-Passed (``oracle``) accuracy per stage over all cases (``{view}_stage{s}``) and per path
#: (``{path}_{view}_stage{s}``), and the mean depth per path (``{path}_depth``).
METRICS: Final[tuple[str, ...]] = (
    *(f"{v}_stage{s}" for v in ("e2e", "oracle") for s in (1, 2, 3, 4)),
    *(f"{p}_{v}_stage{s}" for p in ("RR", "RF", "LF") for v in ("e2e", "oracle") for s in (1, 2, 3, 4)),
    *(f"{p}_depth" for p in ("RR", "RF", "LF")),
)
#: What an lmms-eval export writes at its top (what ``overwrite`` may replace).
LMMS_NAMES: Final[tuple[str, ...]] = (*HF_NAMES, "*.yaml", "utils.py")
_NAME: Final = re.compile(r"[a-z][a-z0-9_]*")


def utils_source() -> str:
    """The task's ``utils.py``."""
    bindings = "\n\n".join(f'''def doc_to_messages_{o}(doc, round_idx=None, previous_output=None,
                        previous_round_info=None):
    return _cx.doc_to_messages(doc, "{o}", round_idx, previous_output, previous_round_info)


def process_results_{o}(doc, results):
    return _cx.process_results(doc, results, "{o}")''' for o in ORACLES)
    return f'''"""lmms-eval bindings of the CheXpercept tasks (written by `cxrground percept export`).

Every function is cxrground's own (cxrground.evaluation.percept.lmms): the harness's conversation, oracle
settings, answer parser and scorer, so the numbers are those of `cxrground percept eval`.
"""

from cxrground.evaluation.percept import lmms as _cx

doc_to_visual = _cx.doc_to_visual
doc_to_text = _cx.doc_to_text


{bindings}


for _metric in _cx.METRICS:
    globals()[f"agg_{{_metric}}"] = _cx.aggregator(_metric)
'''


def task_yaml(name: str, oracle: str, data_files: str) -> str:
    """The YAML of the task of one oracle setting."""
    metrics = "".join(f"  - metric: {m}\n    aggregation: !function utils.agg_{m}\n    higher_is_better: true\n"
                      for m in METRICS)
    return f"""# CheXpercept, oracle setting "{oracle}" (written by cxrground percept export --format lmms-eval)
task: {name}_{oracle}
dataset_path: parquet
dataset_kwargs:
  data_files:
    {SPLIT}: {data_files}
test_split: {SPLIT}
output_type: generate_until_multi_round
doc_to_visual: !function utils.doc_to_visual
doc_to_text: !function utils.doc_to_text
doc_to_messages: !function utils.doc_to_messages_{oracle}
doc_to_target: detection_answer
process_results: !function utils.process_results_{oracle}
generation_kwargs:
  max_new_tokens: {MAX_NEW_TOKENS}
  temperature: 0
  do_sample: false
lmms_eval_specific_kwargs:
  default:
    oracle: {oracle}
metric_list:
{metrics}metadata:
  version: 1
"""


def export_lmms_task(bench: str | Path, out: str | Path, name: str = "chexpercept", shard_rows: int = 500,
                     validate: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Write the Hugging Face export of ``bench`` and the lmms-eval task files into ``out`` (module docstring);
    returns the task names, the case count and the notes of the check before it (``validate``, ``overwrite``: as
    :func:`~cxrground.percept.export_hf.export_hf`)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"task name {name!r}: use lower-case letters, digits and '_' (starting with a letter)")
    out = Path(out)
    benchmark, notes = load_for_export(bench, out, validate)
    data_files = str((out / DATA_DIR).resolve() / f"{SPLIT}-*.parquet")
    tasks = [f"{name}_{o}" for o in ORACLES]
    with export_folder(out, overwrite, LMMS_NAMES, "lmms-eval") as stage:
        write_hf(benchmark, stage, shard_rows)
        for oracle in ORACLES:
            (stage / f"{name}_{oracle}.yaml").write_text(task_yaml(name, oracle, data_files), encoding="utf-8")
        (stage / f"{name}.yaml").write_text(f"group: {name}\ntask:\n" + "".join(f"  - {t}\n" for t in tasks)
                                            + "metadata:\n  version: 1\n", encoding="utf-8")
        (stage / "utils.py").write_text(utils_source(), encoding="utf-8")
    return {"tasks": tasks, "cases": len(benchmark.cases), "notes": notes}
