"""README.md and docs/: every relative link names a file of the repository, and every #anchor a heading of its
target as GitHub writes anchors (lower case; punctuation other than - and _ dropped; spaces become -)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.M)}


def test_anchor_follows_github():
    assert anchor("Decomposition bound (`bench/decomposition.py`)") == "decomposition-bound-benchdecompositionpy"
    assert anchor("Decision latency of the paper-size network at n = 1,024") == "decision-latency-of-the-paper-size-network-at-n--1024"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{fragment}")
    assert not broken, f"{page.name}: " + "; ".join(broken)
