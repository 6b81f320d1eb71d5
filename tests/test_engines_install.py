"""The engine installer (`integrations.install`, `schedspec install-engines`) on fake manifests.

Each fake engine is a tiny wheel built here (no network): pip installs it with --no-deps into
a temporary engine cache ($SCHEDSPEC_ENGINE_CACHE), the import check runs, the stamp is written
last; a complete install is reused, --force redoes it, failures name the package and exit 1,
unknown engines exit 2.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import shutil
import sys
import threading
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from integrations import install
from integrations.manifest import LAYOUT, STAMP, EngineManifest, EngineNotInstalled, Package
from spec.errors import ConfigError
from tests.mined_constants import draws


def make_wheel(directory: Path, name: str, files: dict[str, str], version: str = "1.0") -> Path:
    """A minimal pure-Python wheel holding `files` (path -> source)."""
    dist = f"{name}-{version}"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    meta = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    entries = {**files, **meta}
    # each file's hash, as a real wheel records it (pip copies them into the install's RECORD)
    record = "".join(f"{p},{_sha256(text)},{len(text)}\n" for p, text in entries.items())
    record += f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in entries.items():
            zf.writestr(p, text)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return path


def _sha256(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(root))
    return root


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    d = tmp_path / "wheels"
    d.mkdir()
    return d


@pytest.fixture
def fake_module() -> Iterator[types.ModuleType]:
    """A module `schedspec_fake_engine` exporting MANIFEST, as integrations.<engine> does."""
    module = types.ModuleType("schedspec_fake_engine")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def fake_manifest(*packages: Package, check: str = "fakepkg_a") -> EngineManifest:
    return EngineManifest(
        engine="fake", version="1.0", packages=packages, import_check=check, env=(("FAKE", "1"),)
    )


def test_install_writes_stamp_last_and_reuses_a_complete_install(cache: Path, wheels: Path) -> None:
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": "X = 1\n"})
    manifest = fake_manifest(Package(str(wa)))
    assert not manifest.installed()
    with pytest.raises(EngineNotInstalled, match="schedspec install-engines fake"):
        manifest.activate()
    lines: list[str] = []
    first = install.install(manifest, out=lines.append)
    assert not first.cached
    assert manifest.installed()
    assert (manifest.site_packages / "fakepkg_a" / "__init__.py").read_text() == "X = 1\n"
    assert any("import fakepkg_a ok" in line for line in lines)
    assert any("installed in" in line for line in lines)
    again: list[str] = []
    second = install.install(manifest, out=again.append)
    assert second.cached
    assert any("cached" in line for line in again)
    forced = install.install(manifest, force=True, out=again.append)
    assert not forced.cached and manifest.installed()


def test_a_hand_patched_install_says_which_sources_differ_from_the_release(
    cache: Path, wheels: Path
) -> None:
    """Checking a change to an engine by patching its install keeps the install (its stamp
    still lists the release's pins) but is said, by `modified_sources` (what `verify`'s
    record names) and by `install-engines`, until `--force` reinstalls the release."""
    wa = make_wheel(
        wheels, "fakepkg_a", {"fakepkg_a/__init__.py": "X = 1\n", "fakepkg_a/sched.py": "Y = 2\n"}
    )
    manifest = dataclasses.replace(fake_manifest(Package(str(wa))), sources=("fakepkg_a/",))
    install.install(manifest, out=lambda _: None)
    assert manifest.modified_sources() == ()
    (manifest.site_packages / "fakepkg_a" / "sched.py").write_text("Y = 3\n")
    (manifest.site_packages / "fakepkg_a" / "__init__.py").unlink()
    assert manifest.modified_sources() == ("fakepkg_a/__init__.py", "fakepkg_a/sched.py")
    assert manifest.installed()
    lines: list[str] = []
    assert install.install(manifest, out=lines.append).cached
    assert any("note: 2 of its sources differ from the fake 1.0 release" in line for line in lines)
    install.install(manifest, force=True, out=lambda _: None)
    assert manifest.modified_sources() == ()
    assert dataclasses.replace(manifest, sources=()).modified_sources() == ()


def test_an_install_for_other_pins_is_kept_beside_the_new_one_until_pruned(
    cache: Path, wheels: Path
) -> None:
    """Two checkouts pinning one engine differently (or one before and after a `git pull`)
    each get their own directory: installing for one never undoes the other's install. The
    installer names the other install with what its pins differ in; `--prune` removes it."""
    old_wheel = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": "X = 1\n"})
    old = fake_manifest(Package(str(old_wheel)))
    install.install(old, out=lambda _: None)
    newer = wheels / "newer"
    newer.mkdir()
    new_wheel = make_wheel(newer, "fakepkg_a", {"fakepkg_a/__init__.py": "X = 2\n"}, "2.0")
    manifest = fake_manifest(Package(str(new_wheel)))
    assert manifest.directory != old.directory and manifest.installed_requirements() is None
    assert manifest.other_installs() == (old.directory,)
    with pytest.raises(EngineNotInstalled, match=r"installed only for other pins, in .*fake-1\.0-"):
        manifest.activate()
    lines: list[str] = []
    result = install.install(manifest, out=lines.append)
    assert not result.cached and manifest.installed()
    assert (manifest.site_packages / "fakepkg_a" / "__init__.py").read_text() == "X = 2\n"
    assert old.installed(), "installing for new pins removed the other checkout's install"
    assert (old.site_packages / "fakepkg_a" / "__init__.py").read_text() == "X = 1\n"
    assert old.other_installs() == (manifest.directory,)
    other = [line for line in lines if "another install of fake" in line]
    assert len(other) == 1 and str(old.directory) in other[0] and "--prune" in other[0], lines
    assert f"it pins {old_wheel}" in other[0] and f"not {new_wheel}" in other[0], other
    pruned: list[str] = []
    assert install.install(manifest, prune=True, out=pruned.append).cached
    assert not old.directory.exists() and manifest.installed()
    assert any("pruned another install of fake" in line for line in pruned), pruned
    assert manifest.other_installs() == ()


def test_an_install_in_an_older_schedspecs_directory_is_named_as_such(
    cache: Path, wheels: Path
) -> None:
    """Before pins named the directories an install lived in `<cache>/<engine>-<version>`: it is
    another install of the engine (an older schedspec's environment may use it), named so."""
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    install.install(manifest, out=lambda _: None)
    shutil.copytree(manifest.directory, cache / "fake-1.0")
    lines: list[str] = []
    assert install.install(manifest, out=lines.append).cached
    older = [line for line in lines if "another install of fake" in line]
    assert len(older) == 1 and "the same pins, in an older schedspec's directory" in older[0]


def test_an_install_of_the_layout_before_site_packages_is_another_install(
    cache: Path, wheels: Path
) -> None:
    """Before `site-packages/` the packages lay at the top of the install's directory, named by
    a digest of the requirements alone. The layout is part of the digest now, so such an
    install is another directory, never taken for this layout's (whose `sys.path` entry it
    lacks): it is named as an older schedspec's, and the packages are installed anew."""
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    install.install(manifest, out=lambda _: None)
    digest = hashlib.sha256("\n".join(manifest.requirements).encode()).hexdigest()[:10]
    before = cache / f"fake-1.0-{digest}"
    assert before != manifest.directory
    shutil.copytree(manifest.site_packages, before)
    shutil.copy(manifest.stamp, before / STAMP)
    assert manifest.other_installs() == (before,)
    lines: list[str] = []
    assert install.install(manifest, out=lines.append).cached
    older = [line for line in lines if "another install of fake" in line]
    assert len(older) == 1 and "the same pins, in an older schedspec's directory" in older[0]


def _draws_beside(module_source: str, site: Path, work: Path) -> str:
    """What a derandomized test draws in a fresh process that loaded the module `fakeconst`
    (`module_source`, placed in `site`), as an engine is loaded while the suite runs."""
    site.mkdir(parents=True)
    (site / "fakeconst.py").write_text(module_source)
    return draws(work, directory=site, module="fakeconst")


def test_what_hypothesis_draws_does_not_depend_on_an_engines_source(tmp_path: Path) -> None:
    """Hypothesis mines integer and string constants from the source of every loaded module it
    takes for the user's own code, and draws them now and then: an engine installed where it
    takes the engine for the user's code made the suite's programs depend on the engine's
    source (two Vidur releases got different programs from one seed). Under the install's
    `site-packages/` it is third-party code, as under a normal install: two modules that differ
    only in their constants give the same draws there; elsewhere (the control) they do not."""
    sources = [
        f"VALUES = {tuple(range(start, start + 60 * 7919, 7919))}\n" for start in (100_003, 500_009)
    ]
    layout = [
        _draws_beside(src, tmp_path / f"e{i}" / LAYOUT, tmp_path / f"w{i}")
        for i, src in enumerate(sources)
    ]
    assert layout[0] == layout[1], "an engine's constants changed what Hypothesis draws"
    plain = [
        _draws_beside(src, tmp_path / f"p{i}" / "engine", tmp_path / f"v{i}")
        for i, src in enumerate(sources)
    ]
    assert plain[0] != plain[1], "control: Hypothesis no longer mines the constants of local code"


def test_installs_of_other_engines_and_unstamped_directories_are_not_other_pins(
    cache: Path, wheels: Path
) -> None:
    """Only complete installs of the same engine count: an interrupted one (no stamp), another
    engine whose name shares the prefix, and a stray file are never named or pruned."""
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    install.install(manifest, out=lambda _: None)
    (cache / "fake-0.9-interrupted").mkdir()
    (cache / "fake-0.9-file").write_text("")
    cousin = EngineManifest(
        engine="fake-cousin", version="1.0", packages=(Package(str(wa)),), import_check="fakepkg_a"
    )
    install.install(cousin, out=lambda _: None)
    assert manifest.other_installs() == () and cousin.other_installs() == ()
    install.install(manifest, prune=True, out=lambda _: None)
    assert (cache / "fake-0.9-interrupted").is_dir() and cousin.installed()


@pytest.mark.parametrize("stamp", ["", "not json", "[]", '{"packages": "fakepkg_a"}', "\xff"])
def test_an_unreadable_stamp_is_not_an_install(cache: Path, wheels: Path, stamp: str) -> None:
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    install.install(manifest, out=lambda _: None)
    manifest.stamp.write_bytes(stamp.encode("latin-1"))
    assert manifest.installed_requirements() is None
    assert not manifest.installed()
    with pytest.raises(EngineNotInstalled, match="fake is not installed"):
        manifest.activate()
    assert not install.install(manifest, out=lambda _: None).cached
    assert manifest.installed()


def test_every_shipped_manifest_pins_every_package() -> None:
    # an unpinned package installs whatever the registry serves that day: CI would test
    # another set of packages than the one recorded in docs/engines.md
    for name in install.ENGINE_MODULES:
        manifest = install.load_manifest(name)
        unpinned = [p.name for p in manifest.packages if not p.version]
        assert not unpinned, f"{name}'s manifest leaves {unpinned} unpinned"
        assert all("==" in r for r in manifest.requirements)


def test_namespace_directories_of_two_packages_are_merged(cache: Path, wheels: Path) -> None:
    wa = make_wheel(wheels, "fakepkg_a", {"fakens/a.py": "A = 1\n", "fakepkg_a/__init__.py": ""})
    wb = make_wheel(wheels, "fakepkg_b", {"fakens/b.py": "B = 2\n"})
    manifest = fake_manifest(Package(str(wa)), Package(str(wb)), check="fakens.a, fakens.b")
    install.install(manifest, out=lambda _: None)
    names = {p.name for p in (manifest.site_packages / "fakens").iterdir()} - {"__pycache__"}
    assert names == {"a.py", "b.py"}


def test_only_what_the_import_check_reaches_is_compiled(
    cache: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip compiles nothing (most of an engine's modules are never imported: compiling them
    was about 30 % of the default engines' install time); the import check writes the
    bytecode of the modules it reaches, even in an environment that turns bytecode writing
    off (as the suite's image does), so each later process reads them compiled."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    files = {
        "fakepkg_a/__init__.py": "from fakepkg_a import reached\n",
        "fakepkg_a/reached.py": "R = 1\n",
        "fakepkg_a/unreached.py": "U = 1\n",
    }
    manifest = fake_manifest(Package(str(make_wheel(wheels, "fakepkg_a", files))))
    install.install(manifest, out=lambda _: None)
    cached = manifest.site_packages / "fakepkg_a" / "__pycache__"
    compiled = sorted(p.name.split(".")[0] for p in cached.glob("*.pyc")) if cached.is_dir() else []
    assert compiled == ["__init__", "reached"], compiled


def test_failed_import_check_names_it_and_leaves_no_stamp(cache: Path, wheels: Path) -> None:
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": "import not_installed_dep\n"})
    manifest = fake_manifest(Package(str(wa)))
    with pytest.raises(install.InstallFailed) as err:
        install.install(manifest, out=lambda _: None)
    assert "import fakepkg_a" in str(err.value)
    assert "not_installed_dep" in err.value.last_line
    assert not manifest.installed()


def test_an_incomplete_install_is_redone(cache: Path, wheels: Path) -> None:
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    manifest.directory.mkdir(parents=True)
    (manifest.directory / "leftover.py").write_text("")
    result = install.install(manifest, out=lambda _: None)
    assert not result.cached
    assert not (manifest.directory / "leftover.py").exists()
    assert manifest.installed()


def test_main_exit_codes(
    cache: Path, wheels: Path, fake_module: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    modules = {"fake": fake_module.__name__, "absent": "schedspec_no_such_engine"}
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    vars(fake_module)["MANIFEST"] = fake_manifest(Package(str(wa)))
    assert install.main(["fake"], modules=modules) == 0
    assert "ready in" in capsys.readouterr().out
    assert install.main(["all"], modules=modules) == 0  # `all` skips absent adapter packages
    assert "cached" in capsys.readouterr().out
    first = vars(fake_module)["MANIFEST"]
    wb = make_wheel(wheels, "fakepkg_b", {"fakepkg_a/__init__.py": ""})
    vars(fake_module)["MANIFEST"] = fake_manifest(Package(str(wb)))  # the pins moved
    assert install.main(["fake"], modules=modules) == 0
    assert "another install of fake" in capsys.readouterr().out and first.installed()
    assert install.main(["fake", "--prune"], modules=modules) == 0
    assert "pruned" in capsys.readouterr().out and not first.directory.exists()

    assert install.main(["nonsense"], modules=modules) == 2
    err = capsys.readouterr().err
    assert "engine='nonsense'" in err and "fake, absent, all" in err
    assert install.main(["absent"], modules=modules) == 2
    assert "schedspec_no_such_engine" in capsys.readouterr().err
    assert install.main(["--bogus"], modules=modules) == 2
    err = capsys.readouterr().err
    assert "--bogus" in err and len(err.strip().splitlines()) == 1
    assert err.startswith("schedspec install-engines: error: ")
    assert install.main(["fake", "--jobs", "-1"], modules=modules) == 2
    assert capsys.readouterr().err.startswith("schedspec install-engines: error: invalid --jobs=-1")

    missing = wheels / "missing-1.0-py3-none-any.whl"
    vars(fake_module)["MANIFEST"] = fake_manifest(Package(str(missing)))
    assert install.main(["fake", "--force"], modules=modules) == 1
    err = capsys.readouterr().err
    assert "pip install" in err and "missing-1.0-py3-none-any.whl" in err
    assert len(err.strip().splitlines()) == 1


def test_the_real_engine_modules_are_named() -> None:
    assert set(install.ENGINE_MODULES) == {"vllm", "sglang", "vidur"}
    with pytest.raises(install.UnknownEngine, match="vllm, sglang, vidur, all"):
        install.resolve(["tensorrt"])


def test_an_unusable_cache_is_exit_2_with_one_line(
    tmp_path: Path,
    wheels: Path,
    fake_module: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(blocker / "cache"))  # under a file
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    vars(fake_module)["MANIFEST"] = fake_manifest(Package(str(wa)))
    assert install.main(["fake"], modules={"fake": fake_module.__name__}) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(blocker) in err and "SCHEDSPEC_ENGINE_CACHE" in err and "Traceback" not in err


def test_a_relative_cache_is_made_absolute_where_it_is_read(
    tmp_path: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", "rel-cache")
    wa = make_wheel(wheels, "fakepkg_a", {"fakepkg_a/__init__.py": ""})
    manifest = fake_manifest(Package(str(wa)))
    assert manifest.directory == tmp_path / "rel-cache" / f"fake-1.0-{manifest.pins}"
    install.install(manifest, out=lambda _: None)
    monkeypatch.setenv("FAKE", "1")  # what activate sets: undone after the test
    before = list(sys.path)
    try:
        manifest.activate()
        assert sys.path[0] == str(manifest.site_packages)  # absolute: not "rel-cache/..."
        assert manifest.directory.is_absolute()
    finally:
        sys.path[:] = before


def _fake_pip(
    writes: dict[str, str], order: list[str], gate: dict[str, threading.Event]
) -> Callable[[str, Package, Path, str], None]:
    """A stand-in for `install._pip_install`: "installs" a package by writing `writes[name]`
    into `fakens/shared.py` of its staging directory, after the event `gate[name]` (if any)
    is set; records the order packages finish in."""

    def pip(python: str, package: Package, target: Path, engine: str) -> None:
        if package.name in gate:
            assert gate[package.name].wait(60), f"{package.name} was never let through"
        if writes[package.name] == "FAIL":
            order.append(package.name)
            raise install.InstallFailed(engine, f"pip install {package.requirement}", "boom")
        (target / "fakens").mkdir(parents=True)
        (target / "fakens" / "shared.py").write_text(writes[package.name])
        order.append(package.name)
        if f"after:{package.name}" in gate:
            gate[f"after:{package.name}"].set()

    return pip


def test_packages_staged_at_once_merge_in_the_manifests_order(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two pip processes at a time, the second package finishes first (the first waits
    for it), yet the merge and the progress lines follow the manifest: the later package's
    file wins, as in a one-at-a-time install."""
    second_done = threading.Event()
    order: list[str] = []
    writes = {"first": "WHO = 'first'\n", "second": "WHO = 'second'\n"}
    gate = {"first": second_done, "after:second": second_done}
    monkeypatch.setattr(install, "_pip_install", _fake_pip(writes, order, gate))
    manifest = fake_manifest(Package("first"), Package("second"), check="fakens.shared")
    lines: list[str] = []
    install.install(manifest, jobs=2, out=lines.append)
    assert order == ["second", "first"]  # they ran at once: the first waited for the second
    shared = manifest.site_packages / "fakens" / "shared.py"
    assert shared.read_text() == "WHO = 'second'\n"
    progress = [line for line in lines if ") " in line and "/2)" in line]
    assert [line.split()[2] for line in progress] == ["first", "second"], lines
    assert "2 at a time" in lines[0]


def test_the_first_failure_in_the_manifests_order_is_reported_and_no_more_start(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later package failing first does not hide an earlier one's failure; one at a time, a
    failure stops the packages after it from starting; no stamp either way."""
    second_done = threading.Event()
    order: list[str] = []
    writes = {"a": "FAIL", "b": "FAIL", "c": "C = 1\n"}
    gate = {"a": second_done, "after:b": second_done}

    def failing_second(python: str, package: Package, target: Path, engine: str) -> None:
        try:
            _fake_pip(writes, order, gate)(python, package, target, engine)
        finally:
            if package.name == "b":
                second_done.set()

    monkeypatch.setattr(install, "_pip_install", failing_second)
    manifest = fake_manifest(Package("a"), Package("b"), Package("c"))
    with pytest.raises(install.InstallFailed) as err:
        install.install(manifest, jobs=2, out=lambda _: None)
    assert "pip install a" in str(err.value) and order.index("b") < order.index("a")
    assert not manifest.installed()

    order.clear()
    monkeypatch.setattr(install, "_pip_install", _fake_pip(writes, order, {}))
    with pytest.raises(install.InstallFailed, match="pip install a"):
        install.install(manifest, jobs=1, out=lambda _: None)
    assert order == ["a"] and not manifest.installed()


def test_jobs_below_one_is_a_config_error_and_exit_2(
    cache: Path, fake_module: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        install.install(fake_manifest(Package("a")), jobs=0, out=lambda _: None)
    vars(fake_module)["MANIFEST"] = fake_manifest(Package("a"))
    assert install.main(["fake", "--jobs", "0"], modules={"fake": fake_module.__name__}) == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and "at least 1" in err and len(err.strip().splitlines()) == 1


def test_every_sglang_module_the_adapter_imports_is_watched_for_changes() -> None:
    """`MANIFEST.sources` is what a run compares with the release's wheel to say an install is
    MODIFIED (and what `scripts/sglang_findings.py --record` refuses): a hand edit to a module
    the adapter imports but the sources leave out went unnamed (a review's finding)."""
    import re

    from integrations.sglang.manifest import MANIFEST

    text = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted(
            (Path(__file__).resolve().parents[1] / "integrations/sglang").glob("*.py")
        )
    )
    modules = set(re.findall(r"\bsglang(?:\.\w+)+", text))
    unwatched = sorted(
        m
        for m in modules
        if m.startswith("sglang.srt.")
        and not any(
            f"{m.replace('.', '/')}{end}".startswith(MANIFEST.sources) for end in ("/", ".py")
        )
    )
    assert modules and not unwatched, unwatched
