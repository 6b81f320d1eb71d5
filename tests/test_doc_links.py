"""Every relative link in README.md and docs/ reaches its file, and every `#anchor` a heading of
that page (as GitHub names it: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2`
for repeats). Pages move and headings are renamed; a reader following a link from an issue
note or another page must not land on nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown page (code blocks skipped)."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCED.sub("", text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(pages: list[Path]) -> list[str]:
    """`page: link (why)` for every relative link of `pages` that reaches no file or no heading
    (links with a scheme, `https:` and the like, are not followed)."""
    anchors: dict[Path, set[str]] = {}
    broken = []
    for page in pages:
        for url in LINK.findall(FENCED.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z+.-]*:", url):
                continue
            path, _, fragment = url.partition("#")
            target = (page.parent / path).resolve() if path else page.resolve()
            if not target.exists():
                broken.append(f"{page.name}: {url} (no such file)")
            elif fragment and target.suffix == ".md":
                if target not in anchors:
                    anchors[target] = heading_anchors(target.read_text(encoding="utf-8"))
                if fragment not in anchors[target]:
                    broken.append(f"{page.name}: {url} (no such heading)")
    return broken


def test_every_link_in_the_docs_reaches_its_page_and_heading() -> None:
    broken = broken_links(DOCS)
    assert not broken, "\n".join(broken)


def test_a_link_to_a_moved_heading_or_page_is_caught(tmp_path: Path) -> None:
    """The control: the check finds a dead anchor and a dead page, and follows GitHub's naming
    of repeated and punctuated headings."""
    (tmp_path / "a.md").write_text(
        "# A `page`: with punctuation\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "b.md").write_text(
        "[ok](a.md#a-page-with-punctuation) [ok](a.md#twice-1) [ok](https://example.com/#x)\n"
        "[gone](a.md#not-a-heading) [gone](c.md) [gone](#nothing-here)\n",
        encoding="utf-8",
    )
    assert broken_links([tmp_path / "b.md"]) == [
        "b.md: a.md#not-a-heading (no such heading)",
        "b.md: c.md (no such file)",
        "b.md: #nothing-here (no such heading)",
    ]


#: What names a page of ours in prose, a docstring or a message: `docs/engines/vllm.md`.
DOC_PATH = re.compile(r"(?<![\w/.-])docs/\w[\w./-]*?\.md\b")
SOURCES = (
    "spec",
    "reference",
    "properties",
    "gpu",
    "integrations",
    "schedspec_cli",
    "scripts",
    "tests",
)


def dangling_doc_paths(files: list[Path], root: Path) -> list[str]:
    """`file:line: path` for every `docs/....md` that `files` name and `root` does not hold."""
    dangling = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in DOC_PATH.findall(line):
                if not (root / name).is_file():
                    dangling.append(f"{path.relative_to(root)}:{n}: {name}")
    return dangling


def test_every_page_our_code_and_docs_name_exists() -> None:
    """A page split or renamed leaves no docstring, message or doc pointing at the old name
    (links are checked above; this is the plain text that names a page)."""
    files = [*DOCS, *(p for pkg in SOURCES for p in sorted((ROOT / pkg).rglob("*.py")))]
    assert not dangling_doc_paths(files, ROOT)


def test_a_named_page_that_is_gone_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs" / "engines").mkdir(parents=True)
    (tmp_path / "docs" / "engines" / "sglang.md").write_text("# SGLang\n", encoding="utf-8")
    (tmp_path / "a.py").write_text(
        '"""See docs/engines/sglang.md, "Findings", and docs/engines.md."""\n'
        "# not a page: mydocs/x.md, docs/shrunk/\n",
        encoding="utf-8",
    )
    assert dangling_doc_paths([tmp_path / "a.py"], tmp_path) == ["a.py:1: docs/engines.md"]
