"""The structure docs/architecture.md describes: no import cycle between modules, the layer
contracts of pyproject.toml kept, and no module over about 500 lines without a reason at its top."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LONG_MODULE_REASON = "Why this module is long:"
MAX_LINES = 520


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kitae", include_external_packages=False)


def test_no_module_imports_one_that_imports_it_back(graph):
    """Every import, also one inside a function: no chain leads back (lazy imports hide no circle)."""
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported != "kitae" and graph.chain_exists(importer=imported, imported=importer):
                cycles.append(graph.find_shortest_chain(importer=imported, imported=importer) + (imported,))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_layer_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_long_modules_say_why_at_their_top():
    too_long = []
    for path in sorted((ROOT / "kitae").rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any(LONG_MODULE_REASON in line for line in lines[:60]):
            too_long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
    assert not too_long, f"modules over {MAX_LINES} lines without '{LONG_MODULE_REASON}' at their top: {too_long}"
