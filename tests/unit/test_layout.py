"""The package layout holds: the agent loads no consumer SDK, and no import hides in a function
except a cloud SDK loaded on first use. (The layering itself is import-linter's contracts in
pyproject.toml, run by the test command.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# An agent with no cloud sink loads no Azure SDK at all; the cloud sinks load theirs when they
# first send, so the consumer's (tables, blob checkpoints, Key Vault) never load in an agent;
# nor does the consumer's record check (fastjsonschema): an agent makes its records itself.
CONSUMER_SDKS = ("azure.", "bridge.consumer.state.tables", "fastjsonschema")
# Modules that load a cloud SDK when imported, and so may be imported on first use; and the
# consumer's own third-party check (`se-bridge agent` loads the consumer's command module).
SDK_LOADERS = ("bridge.consumer.state.tables", "fastjsonschema")


def loaded_after(code: str) -> list[str]:
    script = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    modules: list[str] = json.loads(done.stdout)
    return modules


def agent_modules() -> list[str]:
    return sorted(f"bridge.agent.{p.stem}" for p in (ROOT / "bridge" / "agent").glob("*.py"))


@pytest.mark.parametrize(
    "code",
    [
        "\n".join(f"import {name}" for name in agent_modules()),
        # What `se-bridge agent` imports: the command line with every sub-command's parser.
        "import bridge.cli\nbridge.cli.build_parser()",
    ],
    ids=["agent packages", "command line"],
)
def test_the_agent_loads_none_of_the_consumers_sdks(code: str) -> None:
    loaded = loaded_after(code)
    assert "bridge.agent.loop" in loaded
    assert [m for m in loaded if m.startswith(CONSUMER_SDKS)] == []


def test_the_agent_packages_import_nothing_of_the_consumer_or_simulator() -> None:
    loaded = loaded_after("\n".join(f"import {name}" for name in agent_modules()))
    assert [m for m in loaded if m.startswith(("bridge.consumer", "bridge.simulator"))] == []


def function_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def test_no_import_hides_in_a_function_but_a_cloud_sdk() -> None:
    hidden = []
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        for line, module in function_imports(path):
            if not module.startswith(("azure.", *SDK_LOADERS)):
                hidden.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert hidden == []
