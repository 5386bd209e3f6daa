"""``cxrground percept export --format lmms-eval OUT``: CheXpercept as lmms-eval tasks.

``OUT`` holds the Hugging Face export of the benchmark (``data/``, ``README.md``; :mod:`.export_hf`) and the task
files lmms-eval reads with ``--include_path OUT``:

- ``{name}_none.yaml``, ``{name}_implicit.yaml``, ``{name}_explicit.yaml``: one task per oracle setting
  (§13.3), each the whole sequential conversation of every case as lmms-eval multi-round generation
  (``generate_until_multi_round``), greedy decoding with the harness's token budget (8192 new tokens);
- ``{name}.yaml``: the group of the three;
- ``utils.py``: thin bindings to :mod:`cxrground.evaluation.percept.lmms`, which replays the harness's own
  conversation, parser and scorer (so cxrground must be importable where lmms-eval runs).

The YAML files name the Parquet shards by absolute path, quoted (lmms-eval loads them with ``datasets``), so a
moved folder is exported again; a path holding a glob character (``[]*?``), which ``datasets`` cannot read, is
refused. A task name that the installed lmms-eval already defines (a task, group or tag of its own task folder,
e.g. ``mmmu``) is refused: ``--tasks`` would run lmms-eval's own. The writer only writes text; it imports nothing
of lmms-eval (the YAML files and templates of its task folder are read as text).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.io.export_dir import export_folder
from cxrground.io.hf import DATA_DIR, HF_NAMES
from cxrground.percept.export_hf import SPLIT, load_for_export, write_hf

__all__ = ["LMMS_NAMES", "METRICS", "ORACLES", "builtin_task_names", "check_data_path", "check_task_name",
           "export_lmms_task", "task_yaml", "utils_source"]

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
#: A top-level ``task``, ``group`` or ``tag`` key of a task YAML and its value.
_TOP_KEY: Final = re.compile(r"""(["']?)(task|group|tag)\1[ \t]*:(.*)$""")


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


def _yaml_text(value: str) -> str:
    """``value`` as a double-quoted YAML scalar (a JSON string is one): no ``#``, ``: `` or quote cuts it short."""
    return json.dumps(value, ensure_ascii=False)


def builtin_task_names() -> frozenset[str]:
    """The task, group and tag names the installed lmms-eval defines in its own task folder (empty when it is not
    installed); read from its YAML files without importing lmms-eval."""
    spec = importlib.util.find_spec("lmms_eval")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    names: set[str] = set()
    for location in spec.submodule_search_locations:
        for path in sorted((Path(location) / "tasks").rglob("*yaml")):
            names.update(_declared_names(path.read_text(encoding="utf-8-sig", errors="replace")))
    return frozenset(names)


def _declared_names(text: str) -> set[str]:
    """The names a task YAML declares at its top level: ``task`` and ``group`` (a name, not a list of members) and
    every ``tag`` (a name, an inline list or a block list)."""
    names: set[str] = set()
    lines = text.splitlines()
    for k, line in enumerate(lines):
        match = _TOP_KEY.match(line)
        if match is None:
            continue
        key, value = match.group(2), match.group(3).split(" #")[0].strip()
        if value.startswith("["):
            if key == "tag":
                names.update(_unquote(v) for v in value.strip("[]").split(",") if v.strip())
        elif value:
            names.add(_unquote(value))
        elif key == "tag":
            for item in lines[k + 1:]:
                entry = re.match(r"\s+-\s*(\S.*)$", item)
                if entry is None:
                    break
                names.add(_unquote(entry.group(1)))
    return names


def _unquote(value: str) -> str:
    """A YAML plain or quoted scalar's text."""
    return value.strip().strip("'\"")


def check_task_name(name: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a valid task name whose group and tasks no built-in lmms-eval
    task, group or tag has (:func:`builtin_task_names`): lmms-eval would run its own instead."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"task name {name!r}: use lower-case letters, digits and '_' (starting with a letter)")
    taken = sorted({name, *(f"{name}_{o}" for o in ORACLES)} & builtin_task_names())
    if taken:
        raise ConfigError(f"task name {name!r}: the installed lmms-eval already defines {', '.join(taken)}, which "
                          "`--tasks` would run instead of this benchmark; choose another --task-name")


def check_data_path(data_files: str) -> None:
    """Raise :class:`ConfigError` when the Parquet glob's folder holds a glob character (``[``, ``]``, ``*``,
    ``?``): ``datasets``, which lmms-eval loads the shards with, cannot read such a path."""
    folder = str(Path(data_files).parent)
    found = sorted(set(folder) & set("[]*?"))
    if found:
        raise ConfigError(f"{folder}: the output path holds {' '.join(found)}, which the `datasets` library reads "
                          "as a glob pattern (lmms-eval could not load the data); choose another folder")


def task_yaml(name: str, oracle: str, data_files: str) -> str:
    """The YAML of the task of one oracle setting."""
    metrics = "".join(f"  - metric: {m}\n    aggregation: !function utils.agg_{m}\n    higher_is_better: true\n"
                      for m in METRICS)
    return f"""# CheXpercept, oracle setting "{oracle}" (written by cxrground percept export --format lmms-eval)
task: {name}_{oracle}
dataset_path: parquet
dataset_kwargs:
  data_files:
    {SPLIT}: {_yaml_text(data_files)}
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
    check_task_name(name)
    out = Path(out)
    data_files = str((out / DATA_DIR).resolve() / f"{SPLIT}-*.parquet")
    check_data_path(data_files)
    benchmark, notes = load_for_export(bench, out, validate)
    tasks = [f"{name}_{o}" for o in ORACLES]
    with export_folder(out, overwrite, LMMS_NAMES, "lmms-eval") as stage:
        write_hf(benchmark, stage, shard_rows)
        for oracle in ORACLES:
            (stage / f"{name}_{oracle}.yaml").write_text(task_yaml(name, oracle, data_files), encoding="utf-8")
        (stage / f"{name}.yaml").write_text(f"group: {name}\ntask:\n" + "".join(f"  - {t}\n" for t in tasks)
                                            + "metadata:\n  version: 1\n", encoding="utf-8")
        (stage / "utils.py").write_text(utils_source(), encoding="utf-8")
    return {"tasks": tasks, "cases": len(benchmark.cases), "notes": notes}
