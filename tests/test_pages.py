"""The pages a user reads stay true and short.

- Every relative link in README.md and docs/*.md resolves to a path of the repository (its ``#anchor``,
  in a Markdown file, to an ``<a id>`` or a heading there), and none points out of it. Every JSON a page
  cites in backticks exists beside the page, under docs/benchmarks/ or from the repository root; names
  that are not citations are left alone: absolute paths, patterns (``<id>``, ``*``), placeholders in
  capitals (``RESULT.json``) and the names of files qaopt or its scripts write (a name in their code,
  such as a run folder's ``result.json``).
- No page, code or test says how qaopt was made: no line matches the development-round pattern below.
- README.md, docs/results.md, docs/BENCHMARKS.md and the topic docs keep within their sizes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
CODE_DIRS = ["qaopt", "app_spec", "calibrate", "approx", "kernels", "simulators", "benchmarks"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"`([^`\s]+\.json)`")
FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
INLINE = re.compile(r"`[^`\n]*`")
# Built in two pieces so that this file does not match it itself.
ROUND = re.compile(("[Ss]ession" + " [0-9]").encode())
KB = 1024
LIMITS = {"README.md": 10 * KB, "docs/results.md": 15 * KB, "docs/BENCHMARKS.md": 80 * KB}
TOPIC_LIMIT = 25 * KB  # every other docs/*.md stays under it


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _anchors(markdown: Path) -> set[str]:
    """The ``<a id>`` anchors of a Markdown file and the GitHub slugs of its headings."""
    text = markdown.read_text()
    headings = re.findall(r"^#+ (.*)$", text, re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    return set(re.findall(r'<a id="([^"]+)">', text)) | slugs


def _written_names() -> set[str]:
    """The ``*.json`` file names that qaopt's code and its scripts write or read."""
    names = set()
    for folder in CODE_DIRS:
        for file in (ROOT / folder).rglob("*"):
            if file.suffix in (".py", ".sh") and "__pycache__" not in file.parts:
                names |= set(re.findall(r"[\w.+-]+\.json", file.read_text(errors="replace")))
    return names


def _not_a_citation(name: str, written: set[str]) -> bool:
    stem = name.rsplit("/", 1)[-1][: -len(".json")]
    return (name.startswith("/") or any(c in name for c in "<>*{}")
            or re.fullmatch(r"[A-Z][A-Z0-9_]*", stem) is not None or name.rsplit("/", 1)[-1] in written)


def _problems(text: str, page: Path, written: set[str] = frozenset()) -> list[str]:
    """What in a page's text does not resolve; relative links resolve against the page's folder."""
    base, problems = page.parent, []
    text = FENCE.sub("", text)  # code blocks hold code, not links
    for target in LINK.findall(INLINE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else page
        if file != ROOT and ROOT not in file.parents:
            problems.append(f"{target}: outside the repository")
        elif not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: no anchor #{anchor} in {_name(file)}")
    for name in CITED.findall(LINK.sub("", text)):  # a link's own text was checked as the link
        if _not_a_citation(name, written):
            continue
        if not any((where / name).is_file() for where in (base, DOCS / "benchmarks", ROOT)):
            problems.append(f"`{name}`: no such JSON beside the page, under docs/benchmarks/ or the repository")
    return problems


@pytest.fixture(scope="module")
def written() -> set[str]:
    return _written_names()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_and_cited_json_resolves(page, written):
    problems = _problems(page.read_text(), page, written)
    assert not problems, f"{_name(page)}:\n" + "\n".join(problems)


def test_results_keeps_its_links():
    assert len(LINK.findall((DOCS / "results.md").read_text())) > 30, "docs/results.md lost its links"


def test_the_link_check_can_fail(written):
    bad = ("[a](benchmarks/missing.json) [b](BENCHMARKS.md#no-such-anchor) [c](../../etc/passwd) "
           "`gone.json` [d](results.md#the-real-result) [e](#no-anchor-here) [f](benchmarks/) "
           "`result.json` `RESULT.json` `closed_loop/<id>.json` `/tmp/x.json` `real_result.json` "
           "[g](https://example.org/x.json) `[h](missing.md)`\n```\nf = nns[name](frames)\n```\n")
    assert _problems(bad, DOCS / "results.md", written) == [
        "benchmarks/missing.json: no such file",
        "BENCHMARKS.md#no-such-anchor: no anchor #no-such-anchor in docs/BENCHMARKS.md",
        "../../etc/passwd: outside the repository",
        "#no-anchor-here: no anchor #no-anchor-here in docs/results.md",
        "`gone.json`: no such JSON beside the page, under docs/benchmarks/ or the repository",
    ]
    # README.md's links resolve from the repository root, not from docs/
    assert _problems("[r](docs/results.md)", ROOT / "README.md") == []
    assert _problems("[r](docs/results.md)", DOCS / "results.md") == ["docs/results.md: no such file"]


def _scanned() -> list[Path]:
    """README.md and every file under docs/ and the code and test folders, git's ignored files left out."""
    roots = ["README.md", "docs", *CODE_DIRS, "tests"]
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *roots],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
        files = [ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but hidden ones
        files = [ROOT / "README.md"] + [f for r in roots[1:] for f in (ROOT / r).rglob("*")
                                        if not any(p.startswith(".") for p in f.relative_to(ROOT).parts)]
    return [f for f in files if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]


def test_no_page_code_or_test_speaks_of_development_rounds():
    files = _scanned()
    assert len(files) > 100 and ROOT / "README.md" in files
    hits = []
    for file in files:
        for number, line in enumerate(file.read_bytes().splitlines(), 1):
            if ROUND.search(line):
                hits.append(f"{_name(file)}:{number}: {line.decode(errors='replace').strip()[:100]}")
    assert not hits, f"{len(hits)} lines:\n" + "\n".join(hits[:40])


def test_the_round_pattern_matches_what_it_should():
    assert ROUND.search(b"as measured in " + b"session" + b" 41") and ROUND.search(b"Session" + b" 9 found")
    assert not ROUND.search(b"readme_runs/session50-quick") and not ROUND.search(b"a session of the tool")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_keep_their_size(page):
    limit = LIMITS.get(_name(page), TOPIC_LIMIT - 1)
    size = len(page.read_bytes())
    assert size <= limit, f"{_name(page)} is {size} bytes, above {limit}"
