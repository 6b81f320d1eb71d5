"""What the candidate fixes of an engine's code share, whatever the engine: the error when the
installed code no longer has a place a fix edits, the edit itself (text that must be there
exactly once, and what takes its place), the fix as a unified patch, the `main` of the scripts
that print one, and `FixSet`: an engine's fixes as edits of its own files, which the tests run
(the edited files, with the changed methods put on the engine's classes for a test) and a
script prints as one patch."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec.errors import SchedSpecError


class FixDoesNotApply(RuntimeError):
    """The installed engine's code does not have the place a fix edits."""


def edit_once(text: str, edits: Iterable[tuple[str, str]], *, file: str, fix: str) -> str:
    """`text` with each (old, new) of `edits` made in turn; every `old` must occur exactly once
    in the text as it stands then (`FixDoesNotApply` names the file, the first line of the
    `old` that is missing or not unique, and `fix`: what needs it, e.g. "the read-only hold fix
    (written against vLLM 0.33.0)")."""
    for old, new in edits:
        found = text.count(old)
        if found != 1:
            first = old.strip().splitlines()[0]
            raise FixDoesNotApply(
                f"{file} has {found} copies of `{first}`; {fix} needs exactly one"
            )
        text = text.replace(old, new)
    return text


def unified_patch(path: str, text: str, fixed: str) -> str:
    """`fixed` against `text` as a unified diff of the engine's file `path` (relative to the
    package's parent, as `git apply -p1` in the engine's checkout wants)."""
    lines = difflib.unified_diff(
        text.splitlines(keepends=True),
        fixed.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(lines)


def print_patch(fix_as_diff: Callable[[], str]) -> int:
    """A patch script's `main`: print the diff, or one line and exit 2 if the engine is not
    installed or its code no longer has the place the fix edits."""
    try:
        diff = fix_as_diff()
    except (FixDoesNotApply, SchedSpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(diff)
    return 0


# ------------------------------------------------------------------ fixes as edits of files
Edit = tuple[str, str, str]  # (module, text there exactly once, what takes its place)


@dataclass(frozen=True, slots=True)
class EngineFix:
    """One candidate fix, as edits of an engine's own files: the edits, in order, the methods
    of the engine's classes it changes or adds, as (module, "Class.method") — what
    `FixSet.applied` puts in place — one line saying what it fixes and how (what a fix list
    prints), and the attributes its edit of an `__init__` adds (`state`)."""

    name: str
    edits: tuple[Edit, ...]
    methods: tuple[tuple[str, str], ...]
    summary: str = ""
    #: What the fix's edit of an `__init__` gives a new object, as (attribute, factory), for
    #: a caller that gives the fix to an object already built (`ScheduleFix.apply` sets them).
    state: tuple[tuple[str, Callable[[], Any]], ...] = ()
    #: The same fix written for other releases, as (text only that release's file has, the
    #: fix as written for it): where the file of the variant's first edit has the text, that
    #: variant is made instead (`FixSet.installed_variant`). A later release may keep every
    #: place a fix edits and still need other edits, so the release is told by what its file
    #: has, not by whether the edits apply.
    releases: tuple[tuple[str, EngineFix], ...] = ()

    def variant_for(self, text_of: Callable[[str], str]) -> EngineFix:
        """This fix as written for the release whose files `text_of` (module -> text) reads:
        the first of `releases` whose text that file has, else this one."""
        for marker, variant in self.releases:
            if marker in text_of(variant.edits[0][0]):
                return variant
        return self


def module_file(module: str) -> str:
    """A module's file, relative to the package's parent (as a patch names it)."""
    return module.replace(".", "/") + ".py"


def module_text(module: str) -> str:
    """The text of the file `module` is imported from (the engine must be importable)."""
    return Path(inspect.getsourcefile(importlib.import_module(module)) or "").read_text(
        encoding="utf-8"
    )


@dataclass(frozen=True, slots=True)
class KnownFix:
    """A candidate fix of a known finding, as `schedspec verify` tries it on a failure: its
    `name`, what it fixes (`summary`, one line), the rules its finding breaks (`rules`),
    `apply`, its fix set's `applied` (`FixSet.applied`), the patterns a failure's message
    must match for some of those rules (`messages`: rule -> regular expression; `breaks`), and
    whether it changes a decision
    before the failure by design (`by_design`: an AR reservation's size, a dLLM admission
    estimate), so that the decision is not held against it (`first_other_decision` of
    `properties.ar.example.ArExample` and `properties.example.DllmExample`), and a `witness`
    of its finding's mechanism, if it has one: a context manager factory that spies on the
    engine while the failing example runs again as released and yields the list it notes
    each act of the mechanism in (`integrations.sglang.witness`)."""

    name: str
    summary: str
    rules: frozenset[str]
    apply: Callable[[Iterable[str]], contextlib.AbstractContextManager[None]]
    by_design: bool = False
    messages: tuple[tuple[str, str], ...] = ()
    witness: Callable[[], contextlib.AbstractContextManager[list[str]]] | None = None

    def breaks(self, rule: str, message: str) -> bool:
        """Whether its finding can be the failure: `rule` is one of `rules` and, where
        `messages` gives the rule a pattern (a regular expression: what the finding's failure
        says, e.g. `Out of memory` for an `implementation_error`, which any crash breaks), the
        failure's `message` matches it."""
        if rule not in self.rules:
            return False
        pattern = dict(self.messages).get(rule)
        return pattern is None or re.search(pattern, message) is not None

    def applied(self, *also: str) -> contextlib.AbstractContextManager[None]:
        """A context manager within which the engine runs with this fix and the fixes named
        in `also` (of the same fix set)."""
        return self.apply((*also, self.name))


@dataclass(frozen=True)
class FixSet:
    """The candidate fixes of one engine version, made as edits of its installed files.

    engine: the engine and the version the edits are written against ("SGLang 0.5.23");
    modules: the modules they edit, in the order an edited copy is run (one importing
    another's new name comes after it); fixes: every fix, in the order their edits are made;
    exclusive: sets of fixes that edit the same lines (at most one of each may be chosen);
    load: imports the engine (raising its usual typed error when it is missing); importing:
    what an edited copy runs under (the engine's import stubs, as the engine was imported).
    """

    engine: str
    modules: tuple[str, ...]
    fixes: tuple[EngineFix, ...]
    exclusive: tuple[frozenset[str], ...]
    load: Callable[[], object]
    importing: Callable[[], contextlib.AbstractContextManager[object]]

    def __post_init__(self) -> None:
        # a fix must edit only the modules it names, and declare methods only where it edits
        for fix in self.fixes:
            edited = {module for module, _, _ in fix.edits}
            stray = edited - set(self.modules) or {m for m, _ in fix.methods} - edited
            if stray:
                raise ValueError(
                    f"{self.engine} fix {fix.name!r} names {sorted(stray)}: its methods must lie "
                    f"in modules it edits, and those among {list(self.modules)}"
                )

    @property
    def names(self) -> tuple[str, ...]:
        """The names of `fixes`, in their order."""
        return tuple(fix.name for fix in self.fixes)

    def resolve(self, names: Iterable[str]) -> tuple[EngineFix, ...]:
        """The named fixes in `fixes` order (so any subset composes the same way); a
        `ValueError` names an unknown fix and the valid ones, or two exclusive fixes."""
        wanted = set(names)
        unknown = sorted(wanted - set(self.names))
        if unknown:
            raise ValueError(
                f"unknown {self.engine} fix {unknown[0]!r} (valid: {', '.join(self.names)})"
            )
        for group in self.exclusive:
            if len(group & wanted) > 1:
                raise ValueError(f"{' and '.join(sorted(group & wanted))} edit the same lines")
        return tuple(fix for fix in self.fixes if fix.name in wanted)

    def installed_text(self, module: str) -> str:
        """The installed engine's file of `module`."""
        self.load()
        return module_text(module)

    def installed_variant(self, names: Iterable[str]) -> tuple[EngineFix, ...]:
        """The named fixes (`resolve`), each as written for the installed release
        (`EngineFix.variant_for`)."""
        texts: dict[str, str] = {}

        def text_of(module: str) -> str:
            if module not in texts:
                texts[module] = self.installed_text(module)
            return texts[module]

        return tuple(fix.variant_for(text_of) for fix in self.resolve(names))

    def edit_text(self, module: str, text: str, names: Iterable[str]) -> str:
        """`text`, the file of `module`, with the named fixes' edits of it made (in `fixes`
        order, each as written for the release `text` is of; an edit shared by two fixes once);
        `FixDoesNotApply` names the file, the line and the fix when a place is missing."""

        def text_of(other: str) -> str:
            return text if other == module else self.installed_text(other)

        owners: dict[tuple[str, str], list[str]] = {}  # edit -> the fixes making it
        for fix in (fix.variant_for(text_of) for fix in self.resolve(names)):
            for where, old, new in fix.edits:
                if where == module:
                    owners.setdefault((old, new), []).append(fix.name)
        for edit, makers in owners.items():
            needs = f"the {self.engine} fix {', '.join(makers)}"
            text = edit_once(text, [edit], file=module_file(module), fix=needs)
        return text

    def fixed_sources(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """module -> (the installed text, the text with the named fixes' edits made), for each
        module they edit, in `modules` order (`edit_text`)."""
        fixes = self.installed_variant(names)
        chosen = [fix.name for fix in fixes]
        edited = {module for fix in fixes for module, _, _ in fix.edits}
        out: dict[str, tuple[str, str]] = {}
        for module in self.modules:
            if module in edited:
                text = self.installed_text(module)
                out[module] = (text, self.edit_text(module, text, chosen))
        return out

    def as_diff(self, names: Iterable[str]) -> str:
        """The named fixes as one unified diff of the installed files (paths relative to the
        package's parent, as `git apply -p1` wants)."""
        return "".join(
            unified_patch(module_file(module), text, fixed)
            for module, (text, fixed) in self.fixed_sources(names).items()
        )

    def known(
        self,
        rules_of: Mapping[str, Iterable[str]],
        by_design: Iterable[str] = (),
        messages: Mapping[str, str] | None = None,
        witnesses: Mapping[str, Callable[[], contextlib.AbstractContextManager[list[str]]]]
        | None = None,
    ) -> tuple[KnownFix, ...]:
        """The fixes `rules_of` names (fix -> the rules its finding breaks) as `KnownFix`es,
        those in `by_design` changing a decision before the failure on purpose, each failure of
        a rule in `messages` required to match its pattern (`KnownFix.breaks`), each with its
        finding's witness from `witnesses` if it has one (`ValueError` for an unknown name, as
        `resolve`)."""
        on_purpose = set(by_design)
        return tuple(
            KnownFix(
                fix.name,
                fix.summary,
                frozenset(rules_of[fix.name]),
                self.applied,
                fix.name in on_purpose,
                tuple(sorted((messages or {}).items())),
                (witnesses or {}).get(fix.name),
            )
            for fix in self.resolve(rules_of)
        )

    @contextlib.contextmanager
    def applied(self, names: Iterable[str]) -> Iterator[None]:
        """Within the block the engine runs with the named fixes: each edited file runs as a
        module of its own, its new module-level names go on the engine's module and the
        methods the fixes change or add go on the engine's classes, reading the engine's own
        module globals (so the enums and classes they compare against are the ones the rest of
        the engine uses). Afterwards the engine is as it was. `FixDoesNotApply` (nothing
        changed) if the installed files lack a place."""
        fixes = self.installed_variant(names)
        sources = self.fixed_sources(fix.name for fix in fixes)
        undo: list[tuple[Any, str, Any]] = []  # (owner, attribute, value before or _ABSENT)
        try:
            for module_name, (_, fixed) in sources.items():
                module = importlib.import_module(module_name)
                namespace = self._run_as_module(module_name, fixed)
                for name in namespace.keys() - vars(module).keys():
                    undo.append((module, name, _ABSENT))
                    setattr(module, name, namespace[name])
                methods = {
                    m: None for fix in fixes for where, m in fix.methods if where == module_name
                }
                for dotted in methods:
                    class_name, method = dotted.split(".")
                    owner = getattr(module, class_name)
                    undo.append((owner, method, owner.__dict__.get(method, _ABSENT)))
                    setattr(owner, method, _edited_method(namespace, module, dotted))
            yield
        finally:
            for owner, name, value in reversed(undo):
                if value is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)

    def fixed_methods(self, names: Iterable[str]) -> dict[tuple[str, str], Any]:
        """(module, "Class.method") -> that method as the named fixes leave it, compiled from
        the edited file and reading the engine's own module globals (a zero-argument `super()`
        in it refers to the engine's class): what `applied` puts on the engine's classes, for
        a caller that gives it to one object instead (through a subclass of its class). Only
        for fixes that add no module-level name (their methods could not see it): for those,
        `FixDoesNotApply` says to use `applied`."""
        fixes = self.installed_variant(names)
        out: dict[tuple[str, str], Any] = {}
        for module_name, (_, fixed) in self.fixed_sources(fix.name for fix in fixes).items():
            module = importlib.import_module(module_name)
            namespace = self._run_as_module(module_name, fixed)
            added = sorted(namespace.keys() - vars(module).keys())
            if added:
                raise FixDoesNotApply(
                    f"the {self.engine} fixes {[fix.name for fix in fixes]} add {added} to "
                    f"{module_name}; their methods need them there: use FixSet.applied"
                )
            for fix in fixes:
                for where, dotted in fix.methods:
                    if where == module_name:
                        out[(where, dotted)] = _edited_method(namespace, module, dotted)
        return out

    def _run_as_module(self, module: str, source: str) -> dict[str, Any]:
        """Run an edited file as a module of its own and return its namespace."""
        copy = types.ModuleType(f"{module}_fixed")
        code = compile(source, f"<{module_file(module)}, fixed>", "exec")
        # registered while it runs: its dataclasses look their module up by name
        sys.modules[copy.__name__] = copy
        try:
            with self.importing():
                exec(code, copy.__dict__)
        finally:
            del sys.modules[copy.__name__]
        return copy.__dict__


_ABSENT = object()


def _edited_method(namespace: dict[str, Any], module: types.ModuleType, dotted: str) -> Any:
    """Method `dotted` ("Class.method") of an edited copy's `namespace`, moved onto the
    engine's `module` and its class (`_moved`)."""
    class_name, method = dotted.split(".")
    return _moved(vars(namespace[class_name])[method], module, getattr(module, class_name))


def _moved(function: Any, module: types.ModuleType, owner: type) -> Any:
    """`function`, from an edited copy of `module`, as a method of the engine's class `owner`:
    it reads `module`'s globals, and a zero-argument `super()` in it refers to `owner`."""
    freevars = function.__code__.co_freevars
    if freevars not in ((), ("__class__",)):
        raise FixDoesNotApply(
            f"{function.__qualname__} closes over {freevars}; a fixed method may use super() "
            "but no other closure"
        )
    closure = (types.CellType(owner),) if freevars else None
    moved = types.FunctionType(
        function.__code__, vars(module), function.__name__, function.__defaults__, closure
    )
    moved.__kwdefaults__ = function.__kwdefaults__
    moved.__qualname__ = function.__qualname__
    moved.__doc__ = function.__doc__
    moved.__module__ = module.__name__
    return moved


__all__ = [
    "EngineFix",
    "FixDoesNotApply",
    "FixSet",
    "KnownFix",
    "edit_once",
    "module_file",
    "module_text",
    "print_patch",
    "unified_patch",
]
