"""Every doc reference resolves: relative links in README.md and docs/, every ``docs/...`` path
named anywhere in the repo (code, specs, notebooks), their ``#anchors``, and no ``*.md`` named
that the repository does not have (a user who clones it must be able to read what we cite)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("loadgen", "controllers", "trace_shapes", "actors", "tests", "examples", "benchmarks", "notebooks",
               "docs", ".ci")
SUFFIXES = {".py", ".yaml", ".yml", ".ipynb", ".toml", ".md", ""}

MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_REF = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/](?:#[\w-]+)?")
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md)(?:#[\w-]+)?\b")


def repo_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "pyproject.toml"]
    for d in SOURCE_DIRS:
        root = REPO / d
        if root.is_dir():
            files += [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                      and "__pycache__" not in p.parts and "fixtures" not in p.parts
                      and p != Path(__file__).resolve()]  # this file names broken examples on purpose
    return files


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    found, in_code = set(), False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken(target: str, base: Path) -> str | None:
    """Why ``target`` (a path, maybe with #anchor) does not resolve from ``base``; None if it does."""
    path_part, _, anchor = target.partition("#")
    path = (base / path_part).resolve() if path_part else None
    if path is not None and not path.exists():
        return "no such file"
    if anchor and path is not None and path.suffix == ".md" and anchor not in anchors(path):
        return f"no heading #{anchor}"
    return None


def markdown_links() -> list[tuple[Path, str]]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [(md, m.group(1)) for md in docs for m in MD_LINK.finditer(md.read_text())
            if not re.match(r"^[a-z]+:", m.group(1))]


def docs_references() -> list[tuple[Path, str]]:
    refs = []
    for path in repo_files():
        for m in DOCS_REF.finditer(path.read_text(errors="replace")):
            refs.append((path, m.group(0).rstrip(".")))
    return refs


def test_markdown_links_resolve():
    problems = [f"{md.relative_to(REPO)}: ({target}) {why}" for md, target in markdown_links()
                if (why := broken(target, md.parent))]
    assert problems == []


def test_docs_references_in_code_and_specs_resolve():
    problems = [f"{path.relative_to(REPO)}: {ref} {why}" for path, ref in docs_references()
                if (why := broken(ref, REPO))]
    assert problems == []


def test_no_markdown_file_is_named_that_the_repository_lacks():
    names = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts}
    problems = []
    for path in repo_files():
        for m in MD_NAME.finditer(path.read_text(errors="replace")):
            name = Path(m.group(1)).name
            if name not in names:
                problems.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert problems == []


@pytest.mark.parametrize("text, expected", [
    ("see [the model](engine-model.md#calibration)", None),
    ("see [the model](engine-model.md#no-such-heading)", "no heading #no-such-heading"),
    ("see [gone](cost-model.md)", "no such file"),
])
def test_the_link_check_catches_broken_links(text, expected):
    (target,) = [m.group(1) for m in MD_LINK.finditer(text)]
    assert broken(target, REPO / "docs") == expected


def test_the_reference_scan_finds_outside_files():
    assert [m.group(1) for m in MD_NAME.finditer("as OUTSIDE-NOTES.md section 7 says; docs/experiments.md#measurements")] \
        == ["OUTSIDE-NOTES.md", "docs/experiments.md"]
    assert [m.group(0) for m in DOCS_REF.finditer("(docs/engine-model.md#calibration).")] \
        == ["docs/engine-model.md#calibration"]


@pytest.mark.parametrize("package", ["loadgen/map", "loadgen/sim"])
def test_the_readme_layout_table_names_every_module_of(package):
    readme = (REPO / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith(f"| `{package}/` |")]
    modules = sorted(p.name for p in (REPO / package).glob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if f"`{m}`" not in row] == []
