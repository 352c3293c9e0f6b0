"""docs/results.md's table: every figure there equals the value its JSON holds.

Each row names its JSON in its last cell (a link) and, in backticks after the link, the key of the
figure and, where the figure has an interval, the key of the interval: a path into the JSON with ``/``
between keys and list indexes (``intervals/aware_over_agnostic/ci``). The figure is the first bold
number of the row's second cell, its interval the ``(low-high)`` right after the bold; each must equal
the JSON's value at the rounding shown. A figure followed by ``%`` is the JSON's fraction times 100.
Links and the JSONs they name are checked for every page by tests/test_pages.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results.md"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
KEY = re.compile(r"`([^`]+)`")
NUMBER = r"(\d+(?:\.\d+)?)"
FIGURE = re.compile(r"\*\*" + NUMBER + r"\s*(%?)")
INTERVAL = re.compile(r"^[^*]*\*\*[^*]*\*\*\s*\(" + NUMBER + "-" + NUMBER + r"\)")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")


def _rows(text: str) -> list[list[str]]:
    """The cells of each data row of the page's tables (header and separator rows left out)."""
    rows, previous = [], ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and previous.startswith("|") and not SEPARATOR.match(line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        previous = line if line.startswith("|") else ""
    return rows


def _lookup(data, key: str):
    for part in key.split("/"):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _agrees(shown: str, value, scale: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    decimals = len(shown.partition(".")[2])
    return abs(value * scale - float(shown)) <= 0.5 * 10 ** -decimals + 1e-9


def _problems(text: str, base: Path = DOCS) -> list[str]:
    """Each row whose figure or interval differs from its JSON, or that names no bold figure, JSON or key."""
    problems = []
    for cells in _rows(text):
        label = LINK.sub(r"\1", cells[0])[:60]
        figure = FIGURE.search(cells[1]) if len(cells) > 2 else None
        links = [target for _, target in LINK.findall(cells[-1]) if target.endswith(".json")]
        keys = KEY.findall(LINK.sub("", cells[-1]))
        if not (figure and links and keys):
            problems.append(f"{label}: no bold figure, JSON link or key")
            continue
        try:
            data = json.loads((base / links[0]).read_text())
        except (OSError, ValueError) as error:
            problems.append(f"{label}: {links[0]} unreadable ({error.__class__.__name__})")
            continue
        checks = [(keys[0], [figure.group(1)])]
        interval = INTERVAL.search(cells[1])
        if interval:
            if len(keys) < 2:
                problems.append(f"{label}: an interval without its key")
                continue
            checks.append((keys[1], list(interval.groups())))
        scale = 100 if figure.group(2) else 1
        for key, shown in checks:
            try:
                value = _lookup(data, key)
            except (KeyError, IndexError, ValueError, TypeError):
                problems.append(f"{label}: no key `{key}` in {links[0]}")
                continue
            values = value if isinstance(value, list) else [value]
            if len(values) != len(shown) or not all(_agrees(s, v, scale) for s, v in zip(shown, values)):
                problems.append(f"{label}: shows {'-'.join(shown)}, {links[0]} `{key}` holds {value}")
    return problems


def test_every_figure_in_the_table_equals_its_json():
    text = RESULTS.read_text()
    assert len(_rows(text)) >= 15, "docs/results.md lost its table"
    problems = _problems(text)
    assert not problems, "docs/results.md:\n" + "\n".join(problems)


def test_every_row_links_a_json_under_docs_benchmarks():
    for cells in _rows(RESULTS.read_text()):
        targets = [target for _, target in LINK.findall(cells[-1])]
        assert targets and targets[0].startswith("benchmarks/"), cells[0]


def test_the_figure_check_can_fail():
    source = "[real_result.json](benchmarks/real_result.json) `aware_over_agnostic` `intervals/aware_over_agnostic/ci`"
    table = "\n".join([
        "| figure | value | JSON |",
        "|---|---|---|",
        f"| right | **2.87x** (2.48-4.05) | {source} |",
        f"| wrong figure | **2.88x** (2.48-4.05) | {source} |",
        f"| wrong interval | **2.87x** (2.48-4.06) | {source} |",
        f"| one decimal, right | **2.9x** (2.5-4.1) | {source} |",
        f"| one decimal, wrong | **2.8x** (2.48-4.05) | {source} |",
        "| no key | **2.87x** | [real_result.json](benchmarks/real_result.json) `no_such_key` |",
        "| no interval key | **2.87x** (2.48-4.05) | [real_result.json](benchmarks/real_result.json) `aware_over_agnostic` |",
        "| no source | **2.87x** | none |",
        "| a fraction as a percentage | **95.4 %** | [calibration.json](benchmarks/calibration.json) `2d/boundary/agreement` |",
        "| a fraction shown wrong | **95.3 %** | [calibration.json](benchmarks/calibration.json) `2d/boundary/agreement` |",
        "| [a list index](#x) | **13.21 ms** | [latency_table.json](benchmarks/latency_table.json) `rows/3/cells/openvino/median_ms` |",
    ])
    ratio = json.loads((DOCS / "benchmarks" / "real_result.json").read_text())["aware_over_agnostic"]
    assert _problems(table) == [
        f"wrong figure: shows 2.88, benchmarks/real_result.json `aware_over_agnostic` holds {ratio}",
        "wrong interval: shows 2.48-4.06, benchmarks/real_result.json `intervals/aware_over_agnostic/ci` holds "
        + str(json.loads((DOCS / "benchmarks" / "real_result.json").read_text())["intervals"]["aware_over_agnostic"]["ci"]),
        f"one decimal, wrong: shows 2.8, benchmarks/real_result.json `aware_over_agnostic` holds {ratio}",
        "no key: no key `no_such_key` in benchmarks/real_result.json",
        "no interval key: an interval without its key",
        "no source: no bold figure, JSON link or key",
        "a fraction shown wrong: shows 95.3, benchmarks/calibration.json `2d/boundary/agreement` holds 0.9536000000000001",
    ]
