"""Named backends of one kind (segmenters, detectors, deformers, models, clients ...) behind one helper.

A :class:`Registry` maps a name to a *factory* (a class or a function) with a one-line help text. Factories
stay lazy: a factory that needs a heavy library imports it inside itself, so listing names or help for
the command line imports nothing heavy. :meth:`Registry.create` builds a backend by name and checks its
options first, with the same wording in every registry:

- an unknown name: ``unknown segmenter 'x'; choose one of: unet, given, masks``;
- an option the factory does not take: ``segmenter 'unet' does not accept option 'x'; accepted: ...``;
- a required option left out: ``segmenter 'masks' needs option 'root'``.

The accepted options are read from the factory's signature. A factory that takes ``**kwargs`` must
declare its options explicitly (``register(..., options=[...])``), so that a misspelt option is never
swallowed silently. A name is registered once: registering it again (a notebook cell run twice, a built-in backend
replaced by one's own) needs ``replace=True``.

:func:`check_portable` says whether a backend's registration can be sent to worker processes (which import
cxrground afresh and know only the backends registered on import).

A backend registered with ``needs=("torch", ...)`` names the libraries it imports: :meth:`Registry.need` hands them
to :func:`cxrground.extras.check_needs`, which a command runs for every backend it will use before any work
starts. A backend method that fails on an import all the same raises
:class:`~cxrground.errors.MissingExtraError` naming the backend and the extra (:func:`backend_errors`).
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from cxrground.errors import BackendError, ConfigError, CXRGroundError
from cxrground.extras import Need, is_own_import, missing_extra

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "Backend", "Registry", "backend_errors", "backend_label", "call_backend",
           "check_portable", "check_returned", "read_provenance", "strict_bool"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Backend(Generic[T]):
    """One registered backend: its name, factory, help line, accepted and required option names, whether it
    runs on a GPU when one is there (``gpu``; its ``device=cpu`` option keeps it on the CPU), and the optional
    libraries it imports (``needs``: import names, e.g. ``("torch", "safetensors")``)."""

    name: str
    factory: Callable[..., T]
    help: str
    options: tuple[str, ...]
    required: tuple[str, ...] = ()
    gpu: bool = False
    needs: tuple[str, ...] = ()


def _signature_options(name: str, factory: Callable[..., Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Accepted and required keyword options of ``factory``; refuses ``**kwargs`` (options must be declared)."""
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise TypeError(f"backend {name!r}: its factory takes **kwargs, so register it with options=[...]")
    named = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return (tuple(p.name for p in named), tuple(p.name for p in named if p.default is inspect.Parameter.empty))


class Registry(Generic[T]):
    """Backends of one ``kind`` (e.g. ``"segmenter"``) by name, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._backends: dict[str, Backend[T]] = {}

    @overload
    def register(self, name: str, factory: None = None, *, help: str, options: Iterable[str] | None = None,
                 gpu: bool = False, replace: bool = False, hidden: Iterable[str] = (),
                 needs: Iterable[str] = ()) -> Callable[[F], F]: ...

    @overload
    def register(self, name: str, factory: F, *, help: str, options: Iterable[str] | None = None,
                 gpu: bool = False, replace: bool = False, hidden: Iterable[str] = (),
                 needs: Iterable[str] = ()) -> F: ...

    def register(self, name: str, factory: Callable[..., Any] | None = None, *, help: str,
                 options: Iterable[str] | None = None, gpu: bool = False, replace: bool = False,
                 hidden: Iterable[str] = (), needs: Iterable[str] = ()) -> Any:
        """Add backend ``name``; without ``factory`` this is a decorator. ``options``: for ``**kwargs`` factories;
        ``gpu``: the backend runs on a GPU when one is there (the Ray engine then gives its actors one).
        ``replace``: replace the backend already registered as ``name`` (a built-in one too), keeping its place in
        the order; without it, a name registered already is a :class:`ConfigError`. ``hidden``: parameters of the
        factory that are not options (for tests and code, e.g. an HTTP transport): not listed, not accepted.
        ``needs``: the optional libraries the backend imports (:meth:`need`)."""
        drop = frozenset(hidden)

        def add(fn: F) -> F:
            accepted, required = ((tuple(options), ()) if options is not None else _signature_options(name, fn))
            accepted = tuple(o for o in accepted if o not in drop)
            self.add(Backend(name, fn, help, accepted, required, gpu, tuple(needs)), replace=replace)
            return fn

        return add if factory is None else add(factory)  # type: ignore[arg-type]

    def add(self, backend: Backend[T], *, replace: bool = False) -> None:
        """Add a made :class:`Backend` entry (e.g. one sent to a worker process); ``replace`` as in
        :meth:`register`."""
        if backend.name in self._backends and not replace:
            raise ConfigError(f"{self.kind} {backend.name!r} is already registered; pass replace=True to "
                              "register(...) to replace it")
        self._backends[backend.name] = backend

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order (the CLI's choices)."""
        return tuple(self._backends)

    def help(self, sep: str = "\n") -> str:
        """One ``name: help`` line per backend, joined by ``sep`` (for CLI help)."""
        return sep.join(f"{b.name}: {b.help}" for b in self._backends.values())

    def get(self, name: str) -> Backend[T]:
        """The registered backend ``name``; an unknown name raises :class:`ConfigError`."""
        try:
            return self._backends[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self._backends)}") from None

    def options(self, name: str) -> tuple[str, ...]:
        """Option names backend ``name`` accepts."""
        return self.get(name).options

    def need(self, name: str) -> Need:
        """What backend ``name`` imports, as a :class:`~cxrground.extras.Need` for
        :func:`~cxrground.extras.check_needs` (no modules when it needs no optional library)."""
        return Need(f"{self.kind} {name!r}", self.get(name).needs)

    def check(self, name: str, options: Iterable[str] = ()) -> None:
        """Raise :class:`ConfigError` for an unknown ``name``, an unaccepted option or a missing required one."""
        backend = self.get(name)
        given = list(options)
        for option in given:
            if option not in backend.options:
                accepted = ", ".join(backend.options) if backend.options else "no options"
                raise ConfigError(f"{self.kind} {name!r} does not accept option {option!r}; accepted: {accepted}")
        missing = [r for r in backend.required if r not in given]
        if missing:
            raise ConfigError(f"{self.kind} {name!r} needs option {', '.join(repr(m) for m in missing)}")

    def create(self, name: str, /, **options: Any) -> T:
        """Build backend ``name`` with ``options`` after :meth:`check`; text values (``--X-opt key=value``) of
        options the factory annotates as ``int``, ``float`` or ``bool`` are converted first."""
        self.check(name, options)
        factory = self._backends[name].factory
        return factory(**_coerce_text_options(f"{self.kind} {name!r}", factory, options))

    def __contains__(self, name: object) -> bool:
        return name in self._backends

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def __len__(self) -> int:
        return len(self._backends)


class _Interactive(Exception):
    """A pickled object refers to a definition of an interactive ``__main__``."""


def _main_is_interactive() -> bool:
    """Whether ``__main__`` is no file a worker process can run again: a notebook or ``python -c`` (no ``__file__``),
    or a script read from standard input (``python - <<EOF``: ``__file__`` is ``<stdin>``)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return not path or not Path(path).is_file()


class _MainFinder(pickle.Pickler):
    """A pickler that stops at the first class or function of an interactive ``__main__``
    (:func:`_main_is_interactive`)."""

    def persistent_id(self, obj: Any) -> None:
        if (isinstance(obj, type) or inspect.isroutine(obj)) and getattr(obj, "__module__", None) == "__main__" \
                and _main_is_interactive():
            raise _Interactive
        return None


def check_portable(kind: str, backend: Backend[Any], dumps: Callable[[Any], bytes] | None = None) -> None:
    """Raise :class:`ConfigError` when the registration ``backend`` of ``kind`` cannot be sent to a worker process.

    With pickle (``dumps`` None: a process pool), a factory pickles by reference, so it must live in a module the
    worker can import: not in an interactive ``__main__`` (a notebook cell, ``python -c``), not a lambda or a local
    function. ``dumps``: the serializer of another engine (e.g. cloudpickle, which copies such definitions).
    """
    try:
        if dumps is not None:
            dumps(backend)
        else:
            _MainFinder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(backend)
    except _Interactive:
        raise ConfigError(f"{kind} {backend.name!r} is defined in this interactive session; worker processes cannot "
                          "import it: use workers=1, or define it in a module and import that module") from None
    except Exception as exc:
        raise ConfigError(f"{kind} {backend.name!r} cannot be sent to worker processes ({type(exc).__name__}: {exc}): "
                          "use workers=1, or register a class or function defined at the top level of a module") \
            from exc


def backend_label(kind: str, backend: Any) -> str:
    """How an error names ``backend`` of ``kind``: ``segmenter 'unet'`` (its ``name``, its registry name, else its
    class name)."""
    name = getattr(backend, "name", None)
    return f"{kind} {name if isinstance(name, str) and name else type(backend).__name__!r}"


@contextmanager
def backend_errors(kind: str, backend: Any, method: str) -> Iterator[None]:
    """Inside: an exception that is not the toolkit's own (:class:`~cxrground.errors.CXRGroundError`) becomes a
    :class:`~cxrground.errors.BackendError` naming the backend and its ``method``; a library that does not import,
    a :class:`~cxrground.errors.MissingExtraError` naming the backend and the extra that provides it."""
    try:
        yield
    except CXRGroundError:
        raise
    except ImportError as exc:
        if is_own_import(exc):
            raise BackendError(f"{backend_label(kind, backend)} failed in {method}(): {type(exc).__name__}: "
                               f"{exc}") from exc
        raise missing_extra(exc, backend_label(kind, backend)) from exc
    except Exception as exc:
        raise BackendError(f"{backend_label(kind, backend)} failed in {method}(): {type(exc).__name__}: {exc}") \
            from exc


def call_backend(kind: str, backend: Any, method: str, expected: type | tuple[type, ...], what: str, /, *args: Any,
                 **kwargs: Any) -> Any:
    """``backend.<method>(*args, **kwargs)`` under :func:`backend_errors`, its result checked by
    :func:`check_returned` against ``expected`` (``what``: how the error words it)."""
    with backend_errors(kind, backend, method):
        value = getattr(backend, method)(*args, **kwargs)
    return check_returned(kind, backend, method, value, expected, what)


def check_returned(kind: str, backend: Any, method: str, value: Any, expected: type | tuple[type, ...],
                   what: str) -> Any:
    """``value`` (what ``backend.<method>()`` returned) when it is an ``expected`` instance, else a
    :class:`~cxrground.errors.BackendError` naming the backend, ``what`` was expected and what came back."""
    if not isinstance(value, expected):
        raise BackendError(f"{backend_label(kind, backend)}: {method}() returned {type(value).__name__}, "
                           f"expected {what}")
    return value


def read_provenance(kind: str, backend: Any) -> dict[str, Any] | None:
    """``backend``'s ``provenance`` (a method, which is called, or a property) made JSON-ready: numpy numbers and
    arrays as Python numbers and lists, tuples as lists, file-system paths as text; None when it has none.

    An error of its own, a value that is not a dict, or one holding anything else JSON cannot write (an object, a
    key that is not text) is a :class:`~cxrground.errors.BackendError` naming the backend and where the value is.
    """
    with backend_errors(kind, backend, "provenance"):
        value = getattr(backend, "provenance", None)
        if callable(value):
            value = value()
    if value is None:
        return None
    check_returned(kind, backend, "provenance", value, dict, "a dict")
    try:
        return _json_ready(value, "provenance")  # type: ignore[no-any-return]
    except _NotJson as exc:
        raise BackendError(f"{backend_label(kind, backend)}: its provenance holds {exc}, which JSON cannot hold "
                           "(use text, numbers, true/false, null, lists and dicts with text keys)") from None


class _NotJson(Exception):
    """A value :func:`json.dumps` cannot write; the message says what and where."""


def _json_ready(value: Any, where: str) -> Any:
    """``value`` with numpy values as Python ones, tuples as lists and paths as text; :class:`_NotJson` otherwise."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        bad = next((k for k in value if not isinstance(k, str)), None)
        if bad is not None:
            raise _NotJson(f"the key {bad!r} ({type(bad).__name__}) in {where}")
        return {k: _json_ready(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)  # numpy numbers and arrays (without importing numpy here)
    if callable(tolist) and type(value).__module__ == "numpy":
        converted = tolist()
        if not isinstance(converted, type(value)):
            return _json_ready(converted, where)
    raise _NotJson(f"a {type(value).__name__} at {where}")


#: The words a boolean setting given as text may be (case-insensitive).
TRUE_WORDS: frozenset[str] = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS: frozenset[str] = frozenset({"0", "false", "no", "off"})


def strict_bool(key: str, value: Any) -> bool:
    """A boolean setting ``key`` given as a bool or as text (true/false, 1/0, yes/no, on/off); any other text is a
    :class:`~cxrground.errors.ConfigError` naming it (a typo must not read as false)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(f"bad value {value!r} for {key or 'a true/false setting'}: expected true or false")


def _scalar_type(annotation: Any) -> type | None:
    """``int``, ``float`` or ``bool`` when ``annotation`` is one of them (or it ``| None``), else None."""
    if annotation in (int, float, bool):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float, bool) else None


def _coerce_text_options(owner: str, factory: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with text values converted to the factory's annotated ``int`` / ``float`` / ``bool``."""
    try:
        params = inspect.signature(factory, eval_str=True).parameters
    except (NameError, TypeError, ValueError):  # annotations that cannot be resolved: pass values as given
        return options
    out = dict(options)
    for key, value in options.items():
        kind = _scalar_type(params[key].annotation) if key in params and isinstance(value, str) else None
        if kind is None:
            continue
        text = value.strip().lower()
        try:
            if kind is bool:
                if text not in TRUE_WORDS | FALSE_WORDS:
                    raise ValueError(value)
                out[key] = text in TRUE_WORDS
            else:
                out[key] = kind(text)
        except ValueError:
            raise ConfigError(f"{owner}: option {key!r} must be {kind.__name__}, got {value!r}") from None
    return out
