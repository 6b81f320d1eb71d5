"""Every relative link in README.md and docs/ reaches its file, and every `#anchor` a heading of
that page (as GitHub names it: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2`
for repeats). Pages move and headings are renamed; a reader following a link from an issue
note or another page must not land on nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
