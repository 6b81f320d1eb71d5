"""`integrations.patches.FixSet` on a small engine written here: fixes as edits of its files,
the edited methods run on its own classes (super() and enums included), everything put back
afterwards, and the fixes as one patch. No real engine needed."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script

CORE = """import enum


class Verdict(enum.Enum):
    ADMIT = 1
    REFUSE = 2


class Base:
    def fits(self, need, free):
        return Verdict.ADMIT if need < free else Verdict.REFUSE


class Child(Base):
    def fits(self, need, free):
        return super().fits(need, free)
"""
POLICY = """from toyengine.core import Base


def budget(free):
    return free
"""

STRICT = ("toyengine.core", "        return Verdict.ADMIT if need < free", "")
AT_PEAK = EngineFix(
    "admit-at-peak",
    (("toyengine.core", "need < free else", "need <= free else"),),
    (("toyengine.core", "Base.fits"),),
)
CHILD_HALVES = EngineFix(
    "child-halves",
    (
        (
            "toyengine.core",
            "        return super().fits(need, free)\n",
            "        return super().fits(halve(need), free)\n",
        ),
        (
            "toyengine.core",
            "\n\nclass Base:\n",
            "\n\ndef halve(need):\n    return need // 2\n\n\nclass Base:\n",
        ),
    ),
    (("toyengine.core", "Child.fits"),),
)
CHILD_DOUBLES = EngineFix(
    "child-doubles",
    (("toyengine.core", "super().fits(need, free)", "super().fits(2 * need, free)"),),
    (("toyengine.core", "Child.fits"),),
)
POLICY_SCALES = EngineFix(
    "budget-scales",
    (("toyengine.policy", "    return free\n", "    return 10 * free\n"),),
    (),
)


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[FixSet]:
    """A toy engine package on sys.path, and its fixes."""
    package = tmp_path / "toyengine"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "core.py").write_text(CORE, encoding="utf-8")
    (package / "policy.py").write_text(POLICY, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        yield FixSet(
            engine="Toy 1.0",
            modules=("toyengine.core", "toyengine.policy"),
            fixes=(AT_PEAK, CHILD_HALVES, CHILD_DOUBLES, POLICY_SCALES),
            exclusive=(frozenset({"child-halves", "child-doubles"}),),
            load=lambda: importlib.import_module("toyengine.policy"),
            importing=contextlib.nullcontext,
        )
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.split(".")[0] == "toyengine"]:
            del sys.modules[name]


def test_applied_runs_the_edited_methods_on_the_engines_own_classes(toy: FixSet) -> None:
    core = importlib.import_module("toyengine.core")
    child = core.Child()
    assert child.fits(4, 4) is core.Verdict.REFUSE
    before = (dict(vars(core.Base)), dict(vars(core.Child)), set(vars(core)))
    with toy.applied(["admit-at-peak", "child-halves"]):
        # the edited Base.fits admits at the peak and returns the engine's own enum member;
        # the edited Child.fits halves through super(), which must still reach Base
        assert child.fits(4, 4) is core.Verdict.ADMIT
        assert child.fits(9, 4) is core.Verdict.ADMIT  # 9 // 2 <= 4
        assert child.fits(10, 4) is core.Verdict.REFUSE
        assert core.halve(7) == 3  # the new module-level name is on the engine's module
    assert (dict(vars(core.Base)), dict(vars(core.Child)), set(vars(core))) == before
    assert child.fits(4, 4) is core.Verdict.REFUSE


def test_fixed_methods_give_one_object_the_edited_methods(toy: FixSet) -> None:
    """`fixed_methods` compiles the edited methods against the engine's own module (its enum,
    super() to its class) and changes nothing of the engine: a subclass carries them to one
    object. A fix that adds a module-level name is refused (its method could not see it)."""
    core = importlib.import_module("toyengine.core")
    before = (dict(vars(core.Base)), dict(vars(core.Child)), set(vars(core)))
    methods = toy.fixed_methods(["admit-at-peak", "child-doubles"])
    assert set(methods) == {("toyengine.core", "Base.fits"), ("toyengine.core", "Child.fits")}
    assert (dict(vars(core.Base)), dict(vars(core.Child)), set(vars(core))) == before
    base = type("Base", (core.Base,), {"fits": methods[("toyengine.core", "Base.fits")]})
    fixed = type("Child", (core.Child, base), {})()
    assert fixed.fits(4, 4) is core.Verdict.ADMIT  # the edited Base.fits, the engine's enum
    assert core.Child().fits(4, 4) is core.Verdict.REFUSE  # every other object as it was
    child = methods[("toyengine.core", "Child.fits")]
    assert child.__globals__ is vars(core)
    assert child.__closure__ is not None and child.__closure__[0].cell_contents is core.Child
    with pytest.raises(FixDoesNotApply, match=r"add \['halve'\] to toyengine.core"):
        toy.fixed_methods(["child-halves"])


def test_any_subset_composes_and_exclusive_fixes_are_refused(toy: FixSet) -> None:
    core = importlib.import_module("toyengine.core")
    with toy.applied(["child-doubles"]):
        assert core.Child().fits(2, 4) is core.Verdict.REFUSE  # 4 < 4 is false
    with toy.applied(["child-doubles", "admit-at-peak"]):
        assert core.Child().fits(2, 4) is core.Verdict.ADMIT
    with pytest.raises(ValueError, match="child-doubles and child-halves edit the same lines"):
        toy.resolve(["child-halves", "child-doubles"])
    with pytest.raises(ValueError, match=r"unknown Toy 1\.0 fix 'nope' \(valid: admit-at-peak"):
        toy.resolve(["admit-at-peak", "nope"])


def test_a_missing_place_is_refused_before_anything_changes(
    toy: FixSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = importlib.import_module("toyengine.core")
    missing = FixSet(
        engine=toy.engine,
        modules=toy.modules,
        fixes=(*toy.fixes, EngineFix("strict", (STRICT,), (("toyengine.core", "Base.fits"),))),
        exclusive=toy.exclusive,
        load=toy.load,
        importing=toy.importing,
    )
    monkeypatch.setattr(
        FixSet,
        "installed_text",
        lambda self, module: (
            Path(importlib.import_module(module).__file__ or "")
            .read_text(encoding="utf-8")
            .replace("need < free", "need<free")
        ),
    )
    methods = dict(vars(core.Base))
    with (
        pytest.raises(
            FixDoesNotApply,
            match=r"toyengine/core\.py has 0 copies of `need < free else`; the Toy 1\.0 fix "
            r"admit-at-peak needs exactly one",
        ),
        missing.applied(["child-halves", "admit-at-peak"]),
    ):
        pass
    assert dict(vars(core.Base)) == methods


def test_the_fixes_are_one_patch_that_git_applies(toy: FixSet, tmp_path: Path) -> None:
    names = ["admit-at-peak", "child-halves", "budget-scales"]
    sources = toy.fixed_sources(names)
    assert list(sources) == ["toyengine.core", "toyengine.policy"]
    patched = git_apply_to_copies(tmp_path / "checkout", sources, toy.as_diff(names))
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    assert "return 10 * free" in sources["toyengine.policy"][1]
    assert toy.as_diff([]) == ""


def test_a_fix_is_made_as_written_for_the_release_installed(
    toy: FixSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fix with `releases` is made as written for the release whose file has the variant's
    text, though the edits written for the first release would apply there too: the variant's
    edits and methods, in `applied`, `fixed_methods`, `edit_text` and the patch alike."""
    core = importlib.import_module("toyengine.core")
    later = EngineFix(
        "admit-at-peak",
        (("toyengine.core", "need < free else", "need <= free + 1 else"),),
        (("toyengine.core", "Base.fits"),),
    )
    both = dataclasses.replace(AT_PEAK, releases=(("# release 2\n", later),))
    versioned = dataclasses.replace(toy, fixes=(both, *toy.fixes[1:]))
    # release 1 (the toy's file as written): the first edits
    assert versioned.installed_variant(["admit-at-peak"]) == (both,)
    with versioned.applied(["admit-at-peak"]):
        assert core.Base().fits(4, 4) is core.Verdict.ADMIT
        assert core.Base().fits(5, 4) is core.Verdict.REFUSE
    # release 2: its file has the marker, and the same place
    release_2 = CORE + "# release 2\n"
    monkeypatch.setattr(
        FixSet,
        "installed_text",
        lambda self, module: release_2 if module == "toyengine.core" else POLICY,
    )
    assert versioned.installed_variant(["admit-at-peak"]) == (later,)
    assert "need <= free + 1 else" in versioned.edit_text(
        "toyengine.core", release_2, ["admit-at-peak"]
    )
    assert "need <= free else" in versioned.edit_text("toyengine.core", CORE, ["admit-at-peak"])
    assert "+        return Verdict.ADMIT if need <= free + 1 else" in versioned.as_diff(
        ["admit-at-peak"]
    )
    fits = versioned.fixed_methods(["admit-at-peak"])[("toyengine.core", "Base.fits")]
    assert fits(core.Base(), 5, 4) is core.Verdict.ADMIT


def test_a_fix_set_refuses_methods_outside_the_modules_it_edits(toy: FixSet) -> None:
    stray = EngineFix("stray", (), (("toyengine.core", "Base.fits"),))
    with pytest.raises(ValueError, match=r"fix 'stray' names \['toyengine.core'\]"):
        FixSet(toy.engine, toy.modules, (stray,), (), toy.load, toy.importing)
    elsewhere = EngineFix("elsewhere", (("toyengine.other", "a", "b"),), ())
    with pytest.raises(ValueError, match=r"fix 'elsewhere' names \['toyengine.other'\]"):
        FixSet(toy.engine, toy.modules, (elsewhere,), (), toy.load, toy.importing)


def test_the_patch_script_lists_every_fix_with_its_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/engine_fixes_diff.py ENGINE --list` needs no engine installed: one line per fix,
    the default set starred, each with what it fixes."""
    script = load_script("engine_fixes_diff")
    for engine, (fixes, default) in script.ENGINES.items():
        assert script.main([engine, "--list"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line[2:].split()[0] for line in lines] == list(fixes.names), engine
        assert [line[2:].split()[0] for line in lines if line[0] == "*"] == list(default)
        assert all(fix.summary for fix in fixes.fixes), engine
        assert all(
            line.rstrip().endswith(fix.summary)
            for line, fix in zip(lines, fixes.fixes, strict=True)
        )


def test_list_alone_lists_every_engines_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    """`scripts/engine_fixes_diff.py --list` with no engine (README: "--list names them all")
    lists every engine's fixes under its name; without --list an engine is needed (one line,
    exit 2)."""
    script = load_script("engine_fixes_diff")
    assert script.main(["--list"]) == 0
    out = capsys.readouterr().out
    for engine, (fixes, _) in script.ENGINES.items():
        block = out.split(f"\n{engine}:\n" if engine != "sglang" else "sglang:\n", 1)[1]
        listed = [line[4:].split()[0] for line in block.splitlines()[: len(fixes.names)]]
        assert listed == list(fixes.names), engine
    with pytest.raises(SystemExit) as stop:
        script.main([])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--list alone" in err, err


def test_importing_the_engines_fixes_imports_no_engine() -> None:
    """The fix lists (what `engine_fixes_diff.py ENGINE --list` prints) load without any engine
    or torch: each engine is imported only when a fix is made or run."""
    code = (
        "import sys\n"
        "import integrations.sglang.fixes, integrations.vidur.fixes, integrations.vllm.fixes\n"
        "import integrations.vllm.preempted_cache_fix, integrations.vllm.kv_load_fixes\n"
        "import integrations.vllm.kv_connector, integrations.vllm.draft_margin_fix\n"
        "import integrations.vllm.spec_pad_fix\n"
        "engines = ('sglang', 'vidur', 'vllm', 'torch')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in engines]\n"
        "assert not bad, bad[:5]\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
