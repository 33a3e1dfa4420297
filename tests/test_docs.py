"""The Python a newcomer copies from README.md and docs/*.md stays true to the package.

Every ```python block parses; every name it imports from kitae exists; and a document's blocks,
read in order, use no name that none of them defines, except the placeholders listed below (a
signature's arguments, a sketch's inputs), so a renamed function or a block that leans on a
variable of another document fails here. Undefined names are found by ruff (a dev dependency
already run on the package), rule F821, over the blocks joined in order.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# Names a document's blocks use on purpose without defining them.
PLACEHOLDERS = {
    "README.md": {
        # the functional API at a glance (docs/functional.md has the whole loop)
        "network", "key", "obs", "batch",
        # the four factories of the agent sketch (examples/custom_dqn.py defines them)
        "train_state_dqn_factory", "explore_factory", "process_experience_factory", "update_step_factory",
        # the experience pipeline's inputs
        "process_fn", "state", "rollout",
    },
    # the API's signatures (the whole loop follows, with `replay` standing for the reader's buffer)
    "docs/functional.md": {"network", "env", "learning_rate", "rng", "obs", "key", "evaluation", "data", "replay"},
}  # fmt: skip


def python_blocks(document: str) -> list[str]:
    return BLOCK.findall((ROOT / document).read_text())


def import_kitae_names(block: str, name: str) -> None:
    """Imports every kitae module and name ``block`` imports; raises ImportError for a missing one."""
    for node in ast.walk(ast.parse(block, filename=name)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kitae":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):  # a submodule not imported yet is a name too
                    importlib.import_module(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kitae":
                    importlib.import_module(alias.name)


def undefined_names(source: str) -> set[str]:
    """The names ``source`` uses and never defines (ruff's F821)."""
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "--output-format", "json",
         "--stdin-filename", "block.py", "-"],
        input=source, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert found.returncode in (0, 1), found.stderr  # 1: findings
    return {finding["message"].split("`")[1] for finding in json.loads(found.stdout)}


def test_the_documents_have_python_blocks():
    counts = {document: len(python_blocks(document)) for document in DOCUMENTS}
    assert counts["README.md"] >= 5 and sum(counts.values()) >= 30, counts  # the pattern finds them


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_parses_and_imports_names_kitae_has(document):
    for index, block in enumerate(python_blocks(document)):
        import_kitae_names(block, f"{document}, block {index}")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_blocks_read_in_order_define_every_name_they_use(document):
    source = "\n".join(python_blocks(document))
    assert undefined_names(source) == PLACEHOLDERS.get(document, set())


def test_the_checks_find_a_missing_import_and_an_undefined_name():
    with pytest.raises(ImportError):
        import_kitae_names("from kitae.runs import preset_agentt\n", "a misspelt import")
    with pytest.raises(ImportError):
        import_kitae_names("import kitae.runz\n", "a misspelt module")
    with pytest.raises(SyntaxError):
        import_kitae_names("agent.train(env\n", "an unclosed call")
    assert undefined_names("from kitae.runs import preset_agent\nrun = agent.train(env)\n") == {"agent", "env"}
