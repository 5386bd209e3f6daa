"""Which optional extra of the package provides each optional library, the line that installs it, and the error
that names it.

:data:`EXTRAS` is the one table of the optional libraries (``cxrground doctor`` reports on it too; a test keeps it
in step with ``[project.optional-dependencies]`` of ``pyproject.toml``). A command that lacks one says so through
:class:`~cxrground.errors.MissingExtraError`: ``anatomy zones needs the 'models' extra: pip install
'cxrground[models]'``, either before any work starts (:func:`check_needs` with the :class:`Need` of every backend a
run will use) or when an import fails after all (:func:`missing_extra`, :func:`import_error_text`).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Final

from cxrground.errors import MissingExtraError

__all__ = ["CORE", "EXTRAS", "ModuleSpec", "Need", "check_needs", "extra_of", "import_error_text", "install_line",
           "is_editable_install", "is_own_import", "missing_extra", "missing_modules", "needs_text"]

#: The distribution name of this package.
DISTRIBUTION: Final[str] = "cxrground"


@dataclass(frozen=True)
class ModuleSpec:
    """A library to look for: its import name, its distribution on PyPI and the extra that installs it."""

    module: str
    dist: str
    extra: str
    needed_for: str
    fix: str | None = None
    """The install line when it is not the extra's (:func:`install_line`)."""


#: The core dependencies (no extra): every command needs them.
CORE: Final[tuple[ModuleSpec, ...]] = tuple(
    ModuleSpec(m, d, "core", "every command") for m, d in (
        ("numpy", "numpy"), ("scipy", "scipy"), ("PIL", "pillow"), ("pydicom", "pydicom"),
        ("pylibjpeg", "pylibjpeg"), ("pycocotools", "pycocotools"), ("click", "click"), ("pydantic", "pydantic"),
        ("tqdm", "tqdm"), ("httpx", "httpx"), ("ijson", "ijson")))

#: The optional extras of ``pyproject.toml`` and the libraries each brings.
EXTRAS: Final[tuple[ModuleSpec, ...]] = (
    ModuleSpec("torch", "torch", "models",
               "the lung U-Net, the baseline ILS model, CXAS, HybridGNet (the built-in chain)"),
    ModuleSpec("safetensors", "safetensors", "models", "reading the shipped and trained weights"),
    ModuleSpec("transformers", "transformers", "vlm", "LISA/ROSALIA, the SAM deformer, hf: VLM clients"),
    ModuleSpec("peft", "peft", "vlm", "LoRA for LISA training"),
    ModuleSpec("accelerate", "accelerate", "vlm", "--device-map and accelerate launch"),
    ModuleSpec("sentencepiece", "sentencepiece", "vlm", "the released LISA/ROSALIA tokenizer"),
    ModuleSpec("num2words", "num2words", "vlm", "SmolVLM's processor"),
    ModuleSpec("bitsandbytes", "bitsandbytes", "vlm", "--quantize 8bit|4bit (needs CUDA at run time)"),
    ModuleSpec("diffusers", "diffusers", "gen", "--synthesizer radedit"),
    ModuleSpec("torchvision", "torchvision", "yolo", "ultralytics (YOLO) and the video processors of hf: VLMs",
               "pip install torchvision  # the build that matches your torch (see the install guide)"),
    ModuleSpec("ultralytics", "ultralytics", "yolo", "--detector yolo",
               "pip install torchvision ultralytics  # beside a torch that torchvision matches"),
    ModuleSpec("deepspeed", "deepspeed", "deepspeed", "--set distributed=deepspeed (ZeRO-2 LISA training)"),
    ModuleSpec("ray", "ray", "ray", "ils build --engine ray"),
    ModuleSpec("fastapi", "fastapi", "serve", "cxrground serve, cxrground review serve"),
    ModuleSpec("uvicorn", "uvicorn", "serve", "cxrground serve, cxrground review serve"),
    ModuleSpec("python_multipart", "python-multipart", "serve", "image uploads to cxrground serve"),
    ModuleSpec("fsspec", "fsspec", "store", "s3:// and gs:// inputs and outputs"),
    ModuleSpec("s3fs", "s3fs", "store", "s3:// paths"),
    ModuleSpec("gcsfs", "gcsfs", "store", "gs:// paths"),
    ModuleSpec("datasets", "datasets", "export", "ils export --format hf, percept export --format hf"),
    ModuleSpec("highdicom", "highdicom", "export", "ils export --format dicom-seg"),
    ModuleSpec("lmms_eval", "lmms-eval", "export", "percept export --format lmms-eval"),
    ModuleSpec("pytest", "pytest", "dev", "make test"),
    ModuleSpec("ruff", "ruff", "dev", "make test (lint)"),
    ModuleSpec("openai", "openai", "dev", "the OpenAI-client tests"),
    ModuleSpec("playwright", "playwright", "dev", "the browser tests"),
    ModuleSpec("mkdocs", "mkdocs", "docs", "the documentation site (mkdocs build --strict in make test)"),
    ModuleSpec("material", "mkdocs-material", "docs", "the documentation site's theme"),
    ModuleSpec("mkdocs_click", "mkdocs-click", "docs", "the generated command reference"),
    ModuleSpec("mkdocstrings", "mkdocstrings", "docs", "the generated Python API reference"),
)


def _spec_of(module: str) -> ModuleSpec | None:
    top = module.split(".")[0]
    return next((s for s in (*CORE, *EXTRAS) if s.module == top), None)


def extra_of(module: str) -> str | None:
    """The extra that provides ``module`` (a top-level import name or a dotted one): the first extra of
    :data:`EXTRAS` that lists it (``torch``: ``models``), ``core`` for a core dependency, None when unknown."""
    spec = _spec_of(module)
    return spec.extra if spec is not None else None


def install_line(extras: Sequence[str] = (), *, editable: bool = False) -> str:
    """The line that installs the package with ``extras``: ``pip install 'cxrground[models,ray]'``, or with
    ``editable`` (a source checkout installed with ``pip install -e``) ``pip install -e '.[models,ray]'``."""
    if editable:
        return f"pip install -e '.[{','.join(extras)}]'" if extras else "pip install -e ."
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'" if extras else f"pip install {DISTRIBUTION}"


def is_editable_install(dist: str = DISTRIBUTION) -> bool:
    """Whether ``dist`` is installed in editable mode (``pip install -e``), as its ``direct_url.json`` records
    (PEP 610); False when it is not installed or records nothing."""
    try:
        text = metadata.distribution(dist).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return False
    try:
        info = json.loads(text) if text else {}
    except ValueError:
        return False
    return bool(isinstance(info, dict) and (info.get("dir_info") or {}).get("editable"))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that does not import, or a module blocked in sys.modules (None)
        return False


def missing_modules(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` that cannot be found (not installed, or blocked with ``sys.modules[name] = None``),
    in order and once each. Found is not imported: a library that is installed but breaks on import is met when
    it is imported (:func:`missing_extra`)."""
    out: list[str] = []
    for module in modules:
        if module not in out and not _importable(module):
            out.append(module)
    return out


def _how(modules: Sequence[str]) -> str:
    """``the 'models' extra: pip install 'cxrground[models]'`` for ``modules`` (the extras in one line, a library's
    own install line where it has one, the plain name of an unknown library)."""
    extras: list[str] = []
    own: list[str] = []
    for module in modules:
        spec = _spec_of(module)
        if spec is None:
            line = f"the module {module!r}"
        elif spec.fix is not None:
            line = f"{spec.module}: {spec.fix}"
        elif spec.extra == "core":
            line = f"{spec.dist}, a core dependency: reinstall with {install_line()}"
        else:
            if spec.extra not in extras:
                extras.append(spec.extra)
            continue
        if line not in own:
            own.append(line)
    parts = []
    if extras:
        names = " and ".join(repr(e) for e in extras)
        parts.append(f"the {names} extra{'s' if len(extras) > 1 else ''}: {install_line(extras)}")
    return "; and ".join(parts + own)


def needs_text(subject: str, modules: Sequence[str]) -> str:
    """``SUBJECT needs the 'models' extra: pip install 'cxrground[models]' (not installed: torch)``."""
    return f"{subject} needs {_how(modules)} (not installed here: {', '.join(modules)})"


@dataclass(frozen=True)
class Need:
    """What one part of a run (``what``: ``segmenter 'unet'``, ``the pose warning``) imports; ``instead``: how to
    run without that part, when there is a way (``build with --no-pose-warning``)."""

    what: str
    modules: tuple[str, ...]
    instead: str = ""


def check_needs(needs: Iterable[Need], subject: str) -> None:
    """A :class:`~cxrground.errors.MissingExtraError` naming every extra that the parts ``needs`` of a run
    (``subject``: ``ils build``) lack and what needs each, before the run starts; nothing when all are there."""
    lacking: list[tuple[Need, list[str]]] = []
    for need in needs:
        gone = missing_modules(need.modules)
        if gone:
            lacking.append((need, gone))
    if not lacking:
        return
    modules = list(dict.fromkeys(m for _, gone in lacking for m in gone))
    lines = [needs_text(subject, modules)]
    if len(lacking) == 1 and lacking[0][0].what in subject and not lacking[0][0].instead:
        lacking = []  # the subject names the one part already
    for need, gone in lacking:
        lines.append(f"  {need.what} needs {', '.join(gone)}" + (f" ({need.instead})" if need.instead else ""))
    raise MissingExtraError("\n".join(lines), modules, [e for m in modules if (e := extra_of(m))])


def _missing_name(exc: ImportError) -> str | None:
    name = getattr(exc, "name", None)
    return name.split(".")[0] if isinstance(name, str) and name else None


def is_own_import(exc: ImportError) -> bool:
    """Whether ``exc`` is about one of cxrground's own modules (a bug or a broken install, not a missing extra)."""
    return (_missing_name(exc) or "") == DISTRIBUTION


def import_error_text(exc: ImportError, subject: str | None = None) -> str:
    """What a failed import means for the user: ``SUBJECT needs the 'models' extra: pip install
    'cxrground[models]' (not installed here: torch)`` for a missing library of an extra; for a library that is
    installed but does not import, that library, why, and the extra that installs it."""
    subject = subject or "this command"
    name = _missing_name(exc)
    if name is None:
        return f"{subject} could not import a library it needs: {exc}"
    if isinstance(exc, ModuleNotFoundError) and not _importable(name):
        return needs_text(subject, [name])
    spec = _spec_of(name)
    fix = ""
    if spec is not None and spec.extra != "core":
        fix = f"; it comes with {_how([name])}"
    return f"{subject} could not import {name} ({type(exc).__name__}: {exc}){fix}"


def missing_extra(exc: ImportError, subject: str | None = None) -> MissingExtraError:
    """:func:`import_error_text` as a :class:`~cxrground.errors.MissingExtraError` (raise it ``from exc``)."""
    name = _missing_name(exc)
    extra = extra_of(name) if name else None
    return MissingExtraError(import_error_text(exc, subject), [name] if name else [],
                             [extra] if extra and extra != "core" else [])
