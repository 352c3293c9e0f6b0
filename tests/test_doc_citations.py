"""Every page the code cites exists, and every section it quotes is a heading of that page.

Code, docstrings and error messages send a reader to the docs: ``(docs/extending.md, 'Adding a backend')``,
``docs/calibration.md, "Stress strata"``, ``(docs/knobs.md)``. A page that was renamed, or a section whose heading
was reworded, leaves the reader at a dead end; so does a cited file under ``docs/benchmarks/`` that was deleted.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("qaopt", "app_spec", "calibrate", "approx", "kernels", "simulators", "benchmarks", "tests", "examples")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt"}

PAGE = re.compile(r"docs/(?P<page>[A-Za-z0-9_\-/]+\.md)")
# What may stand between a page and the section it quotes: closing backticks, "'s", a comma or colon, then spaces,
# one line break (a comment's "#" or a string's indentation after it). A quote right after ".md" closes a string.
SECTION = re.compile(r"(?:``)?(?:'s|,|:)?(?:[ \t]+|[ \t]*\n[ \t]*(?:#[ \t]*)?)(?P<q>[\"'])(?P<section>[^\"'\n]{3,120}?)(?P=q)")
SEPARATOR = re.compile(r"(?:``)?(?:'s|,|:)")
FILE = re.compile(r"docs/benchmarks/[A-Za-z0-9_\-./]+")


def _normal(text: str) -> str:
    text = text.replace("\u2019", "'").replace("`", "").replace("*", "")
    return re.sub(r"\s+", " ", text).strip().lower()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", _normal(text)).strip("-")


def headings(page: Path) -> list[str]:
    """The page's Markdown headings (outside fenced code), normalised."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            found.append(_normal(line.lstrip("#")))
    return found


def anchors(page: Path) -> set[str]:
    """The page's ``<a id="...">`` anchors: a section that is no heading may still be cited by its anchor."""
    return set(re.findall(r"<a id=[\"']([^\"']+)[\"']", page.read_text(encoding="utf-8")))


def citations(text: str) -> list[tuple[str, str | None, int]]:
    """``(page, quoted section or None, offset)`` for every ``docs/<page>.md`` cited in ``text``."""
    out = []
    for m in PAGE.finditer(text):
        if m.group("page").startswith("benchmarks/"):
            continue
        after = text[m.end():]
        s = SECTION.match(after)
        # A bare space before a quote is a section only when a separator or backticks precede it (``docs/x.md
        # "Title"`` is, ``"docs/x.md" in text`` is not: there the quote closes the string).
        section = s.group("section") if s and (SEPARATOR.match(after) or after[:1] in " \t\n") else None
        if section is not None and not re.search(r"[A-Za-z]", section):
            section = None
        out.append((m.group("page"), section, m.start()))
    return out


def problems(text: str, where: str, repo: Path = REPO) -> list[str]:
    """What in ``text`` cites a page, a section or a benchmark file that does not exist."""
    found = []
    for page, section, at in citations(text):
        line = text.count("\n", 0, at) + 1
        path = repo / "docs" / page
        if not path.is_file():
            found.append(f"{where}:{line}: docs/{page}: no such page")
        elif section is not None and not (any(_normal(section) in h for h in headings(path))
                                          or _slug(section) in anchors(path)):
            found.append(f"{where}:{line}: docs/{page}: no heading contains {section!r}")
    for m in FILE.finditer(text):
        cited = m.group(0).rstrip(".,;:)")
        if "..." in cited or re.search(r"--[\w-]+[ =]$", text[max(0, m.start() - 24):m.start()]):
            continue  # elided, or where an option writes (a default output path need not exist yet)
        if not (repo / cited).exists():
            found.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {cited}: no such file")
    return found


def _sources():
    this = Path(__file__).resolve()
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and path.resolve() != this and ".venv" not in path.parts:
                yield path


def test_every_page_and_section_the_code_cites_exists():
    found = [p for path in _sources() for p in problems(path.read_text(encoding="utf-8", errors="replace"),
                                                        str(path.relative_to(REPO)))]
    assert not found, "\n".join(found)


def test_a_missing_page_a_missing_section_and_a_missing_file_are_each_found(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "extending.md").write_text("# Extending\n\n## Adding a backend\n\n```\n# Not a heading\n```\n"
                                                    '<a id="a-second-look"></a>A second look. ...\n')
    (tmp_path / "docs" / "benchmarks" / "kept.json").write_text("{}")
    good = ("raise ValueError('declare one (docs/extending.md, \"adding a BACKEND\")')\n"
            "# see docs/extending.md; the figure: docs/benchmarks/kept.json\n"
            "assert \"docs/extending.md\" in message  # docs/extending.md, 'A second look'\n"
            "    python x.py --json docs/benchmarks/not_yet.json\n")
    assert problems(good, "good.py", tmp_path) == []
    bad = ("# docs/missing.md, 'Anything'\n"
           "x = \"(docs/extending.md, 'Not a heading')\"\n"
           "# docs/extending.md,\n#   \"Adding a frontend\"\n"
           "# docs/benchmarks/gone.json\n")
    assert problems(bad, "bad.py", tmp_path) == [
        "bad.py:1: docs/missing.md: no such page",
        "bad.py:2: docs/extending.md: no heading contains 'Not a heading'",
        "bad.py:3: docs/extending.md: no heading contains 'Adding a frontend'",
        "bad.py:5: docs/benchmarks/gone.json: no such file",
    ]
