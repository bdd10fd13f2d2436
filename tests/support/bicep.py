"""Reading infra/'s Bicep offline: pycep-parser for syntax and structure, checkov for the rest.

No Bicep compiler installs here, so the tests check what can be checked without one: every
file parses, every file it loads exists, the structure (settings, roles, scopes) is what the
docs promise, and checkov finds nothing it was not told why to skip.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, cast

from pycep import BicepParser

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CHECKOV = ROOT / ".venv-tools" / "bin" / "checkov"
CHECKOV_PYTHON = ROOT / ".venv-tools" / "bin" / "python"

# loadTextContent('x') / loadJsonContent('x', ...): paths are relative to the .bicep file.
_LOAD = re.compile(r"load(?:Text|Json|FileAsBase64)Content\(\s*'([^']+)'")
_SKIP = re.compile(r"//\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?$", re.MULTILINE)


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@cache
def _parser() -> BicepParser:
    # Building one costs about 0.7 s of CPU (lark's LALR tables), and one parses any text.
    return BicepParser()


def parse_text(text: str) -> dict[str, Any]:
    """pycep's JSON of a Bicep text; ValueError or lark's error when it is not valid Bicep."""
    return cast("dict[str, Any]", _parser().parse(text=text))


@cache
def parse(path: Path) -> dict[str, Any]:
    return parse_text(path.read_text(encoding="utf-8"))


def loaded_files(path: Path) -> list[Path]:
    """Every file `path` loads with load*Content, resolved against its directory."""
    text = path.read_text(encoding="utf-8")
    return [(path.parent / raw).resolve() for raw in _LOAD.findall(text)]


def skip_comments(path: Path) -> list[tuple[str, str]]:
    """(check id, reason) of every `// checkov:skip=ID:reason` in the file."""
    text = path.read_text(encoding="utf-8")
    return [(check, (reason or "").strip()) for check, reason in _SKIP.findall(text)]


def resources(path: Path, kind: str) -> dict[str, dict[str, Any]]:
    """The file's resources of one type, by symbolic name."""
    found: dict[str, dict[str, Any]] = parse(path).get("resources", {})
    return {name: res for name, res in found.items() if res["type"] == kind}


def variables(path: Path) -> dict[str, Any]:
    return {name: v["value"] for name, v in parse(path).get("variables", {}).items()}


def role_variables(path: Path) -> dict[str, tuple[str, str]]:
    """`var name = 'GUID' // Role Name` lines: symbolic name -> (role definition id, role name)."""
    pattern = re.compile(r"^var (\w+) = '([0-9a-f-]{36})' // (.+)$", re.MULTILINE)
    text = path.read_text(encoding="utf-8")
    return {name: (guid, role.strip()) for name, guid, role in pattern.findall(text)}


def unlooped(config: dict[str, Any]) -> dict[str, Any]:
    """A resource's or module's own properties, inside `[for ...: {...}]` or `if (...) {...}`."""
    if "loop_type" in config or "condition" in config:
        inner: dict[str, Any] = config["config"]
        return inner
    return config


def loop(config: dict[str, Any]) -> dict[str, Any] | None:
    """pycep's loop of a resource or module (`loop_type`: type and detail), or None."""
    found: dict[str, Any] | None = config.get("loop_type")
    return found


def symbol(expression: Any) -> str:
    """A scope as written: `account`, or `queueAccounts[i]` for an element of a loop."""
    if isinstance(expression, str):
        return expression
    operator = expression["operator"]
    assert operator["type"] == "index_accessor", expression
    operands = operator["operands"]
    return f"{symbol(operands['operand_1'])}[{operands['operand_2']}]"


def role_assignments(path: Path) -> list[tuple[str, str, str]]:
    """(resource name, scope symbol, role variable) of every role assignment in the file."""
    out = []
    for name, res in resources(path, "Microsoft.Authorization/roleAssignments").items():
        config = unlooped(res["config"])
        role = config["properties"]["roleDefinitionId"]["function"]["parameters"]
        out.append((name, symbol(config["scope"]), role["resource_name_1"]))
    return out


def run_checkov() -> dict[str, Any]:
    """One checkov scan of infra/ (bicep only, no network); its JSON report."""
    result = subprocess.run(
        [str(CHECKOV), "-d", str(INFRA), "--framework", "bicep", "-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if not result.stdout.strip():
        raise AssertionError(
            f"checkov printed no report (exit {result.returncode}): {result.stderr}"
        )
    report = json.loads(result.stdout)
    # A single framework's report is an object; several would be a list.
    single: dict[str, Any] = report[0] if isinstance(report, list) else report
    return single


_PARSED_BY_CHECKOV = """
import json, sys
from pathlib import Path
from checkov.bicep.parser import Parser
from checkov.bicep.utils import get_scannable_file_paths
paths = get_scannable_file_paths(root_folder=sys.argv[1])
definitions, _, errors = Parser().get_files_definitions(paths)
print(json.dumps({"found": sorted(map(str, paths)), "parsed": sorted(map(str, definitions)),
                  "errors": sorted(map(str, errors))}))
"""


def checkov_parsed_files() -> dict[str, list[str]]:
    """Which .bicep files checkov's own discovery found and its parser read, and which it could not.

    checkov exits 0 and reports nothing about a file it failed to parse unless asked, so the
    tests ask its parser directly, with the same discovery the scan uses.
    """
    result = subprocess.run(
        [str(CHECKOV_PYTHON), "-c", _PARSED_BY_CHECKOV, str(INFRA)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    parsed: dict[str, list[str]] = json.loads(result.stdout)
    return parsed
