"""docs/results.md is what a user reads for the current figures: every link in it must lead somewhere.

Each figure there names its source; a JSON renamed or a section anchor dropped in
docs/BENCHMARKS.md would leave a figure without one. So every relative link must
resolve to a file of the repository (and its ``#anchor``, in a Markdown file, to an
``<a id>`` or a heading there), every JSON file it names must exist, and no link may
point out of the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+\.json)`")


def _anchors(markdown: Path) -> set[str]:
    """The ``<a id>`` anchors of a Markdown file and the GitHub slugs of its headings."""
    text = markdown.read_text()
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}
    return set(re.findall(r'<a id="([^"]+)">', text)) | slugs


def _problems(text: str, base: Path) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else RESULTS
        if ROOT not in file.parents:
            problems.append(f"{target}: outside the repository")
        elif not file.is_file():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: no anchor #{anchor} in {file.relative_to(ROOT)}")
    for name in CODE.findall(LINK.sub("", text)):  # a link's own text was checked as the link
        if name.startswith("/"):
            continue  # a command's output path on the machine that ran it
        if not any((where / name).is_file() for where in (base, base / "benchmarks", ROOT)):
            problems.append(f"`{name}`: no such JSON under docs/, docs/benchmarks/ or the repository")
    return problems


def test_every_link_and_json_in_results_resolves():
    text = RESULTS.read_text()
    assert len(LINK.findall(text)) > 30, "docs/results.md lost its links"
    problems = _problems(text, DOCS)
    assert not problems, "docs/results.md:\n" + "\n".join(problems)


def test_the_link_check_can_fail():
    bad = ("[a](benchmarks/missing.json) [b](BENCHMARKS.md#no-such-anchor) [c](../../etc/passwd) "
           "`gone.json` [d](results.md#summary)")
    assert _problems(bad, DOCS) == [
        "benchmarks/missing.json: no such file",
        "BENCHMARKS.md#no-such-anchor: no anchor #no-such-anchor in docs/BENCHMARKS.md",
        "../../etc/passwd: outside the repository",
        "`gone.json`: no such JSON under docs/, docs/benchmarks/ or the repository",
    ]
