"""The package layout holds: the agent loads no consumer SDK, and no import hides in a function
except a cloud SDK or cryptography loaded on first use or a consumer program loaded by its
sub-command; the extras table is pyproject.toml's. (The layering itself is import-linter's
contracts in pyproject.toml, run by the test command.)"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import extras

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# An agent with no cloud sink loads no Azure SDK at all; the cloud sinks load theirs when they
# first send, so the consumer's (tables, blob checkpoints, Key Vault) never load in an agent;
# nor does the consumer's record check (fastjsonschema): an agent makes its records itself.
CONSUMER_SDKS = ("azure.", "bridge.consumer.state.tables", "fastjsonschema")
# Modules that load a cloud SDK when imported, and so may be imported on first use; and the
# consumer's own third-party check (`se-bridge agent` loads the consumer's command module).
SDK_LOADERS = (
    "bridge.consumer.state.tables",
    "bridge.cloud.managedidentity",
    "fastjsonschema",
    "bridge.kubernetes.client",  # lightkube: only when [kubernetes] is on
    "requests",  # the Event Hubs REST send's: only in an agent that sends to Event Hubs
)
# The consumer's programs, which need the consumer extra: the command line loads them when
# their sub-command runs (bridge/consumer/command.py, bridge/demo.py), so an agent-only install
# starts and says what to install.
ON_DEMAND = ("bridge.consumer.service", "bridge.consumer.explain", "bridge.consumer.people.client",
             "bridge.consumer.people.app", "bridge.consumer.status",
             "bridge.consumer.whatif", "bridge.consumer.weekaheadcheck")  # fmt: skip


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


def test_the_agent_without_kubernetes_loads_no_kubernetes_client() -> None:
    loaded = loaded_after("\n".join(f"import {name}" for name in agent_modules()))
    assert "bridge.agent.drains" in loaded
    assert [
        m for m in loaded if m.startswith(("lightkube", "httpx2", "bridge.kubernetes.client"))
    ] == []


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
                # `from bridge.consumer import service` is bridge.consumer.service
                module = "." * node.level + (node.module or "")
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_import_hides_in_a_function_but_a_cloud_sdk_or_a_consumer_program() -> None:
    hidden = []
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        for line, module in function_imports(path):
            if not module.startswith(("azure.", "cryptography.", *SDK_LOADERS, *ON_DEMAND)):
                hidden.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert hidden == []


def test_the_command_line_loads_no_distribution_of_the_consumer_extra() -> None:
    loaded = loaded_after("import bridge.cli\nbridge.cli.build_parser()")
    modules = {
        "azure.data.tables",
        "azure.eventhub.extensions",
        "fastjsonschema",
        "azure.keyvault",
        "jwt",
        "lightkube",
    }
    assert [m for m in loaded if m.startswith(tuple(modules))] == []
    assert [m for m in loaded if m.startswith(ON_DEMAND)] == []


def test_the_extras_table_is_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = pyproject["project"]["optional-dependencies"]
    for extra, names in extras.EXTRAS.items():
        wanted = [re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0] for d in declared[extra]]
        assert list(names) == wanted
    assert declared["agent"] == []  # the bare package is the agent
    assert declared["functions"][0] == "se-bridge[consumer]"


def test_a_missing_extra_is_named_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    assert extras.missing("consumer") == []  # the test environment has every extra
    assert extras.missing_message("consumer", "consume") == ""
    monkeypatch.setitem(extras.EXTRAS, "consumer", ("fastjsonschema", "no-such-package-se"))
    message = extras.missing_message("consumer", "consume")
    assert "`consume` needs the consumer extra, and no-such-package-se is not installed" in message
    # From the lock's export, with hashes: se-bridge is not on any package index yet, and a
    # name nobody has published there is anyone's to take (issue 31).
    assert "pip install --require-hashes -r packaging/requirements/consumer.txt" in message
    assert "pip install 'se-bridge" not in message


def test_a_component_reading_the_configuration_outside_its_kinds_breaks_a_contract(
    tmp_path: Path,
) -> None:
    """pyproject.toml's contract: sinks, channels, stores and bridge.cloud take their settings
    and an identity; only their kinds modules (bridge.specs' Kind.build) read bridge.config."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "bridge", tmp_path / "bridge", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    planted_in = ("sinks/jsonl.py", "cloud/storage.py", "consumer/state/tables.py",
                  "notify/notifier.py")  # fmt: skip
    for planted in planted_in:
        path = tmp_path / "bridge" / planted
        path.write_text(path.read_text(encoding="utf-8") + "\nimport bridge.config\n", "utf-8")
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, check=False,
    )  # fmt: skip
    said = done.stdout
    assert done.returncode == 1, said + done.stderr
    assert re.search(r"Contracts: \d+ kept, 1 broken\.", said), said
    broken = said[said.index("Broken contracts") :]
    assert "Components read the configuration only in their kinds" in broken
    for planted in planted_in:
        importer = "bridge." + planted.removesuffix(".py").replace("/", ".")
        assert f"{importer} -> bridge.config" in broken
    assert "kinds -> bridge.config" not in broken


def test_the_agent_starts_without_requests() -> None:
    # IMDS is spoken to over http.client; requests served only a test seam, now in tests/doubles.
    loaded = loaded_after("\n".join(f"import {name}" for name in agent_modules()))
    assert "bridge.agent.loop" in loaded
    assert [m for m in loaded if m == "requests" or m.startswith("requests.")] == []


@pytest.mark.parametrize(
    "code",
    [
        "\n".join(f"import {name}" for name in agent_modules()),
        "import bridge.cli\nbridge.cli.build_parser()",
    ],
    ids=["agent packages", "command line"],
)
def test_the_agent_without_a_command_channel_does_not_load_cryptography(code: str) -> None:
    # cryptography costs ~8 MB resident on every VM; only an agent with a command channel
    # verifies a signature, and it loads cryptography when it reads its key (issue 31).
    loaded = loaded_after(code)
    assert "bridge.commands.signing" in loaded
    assert [m for m in loaded if m == "cryptography" or m.startswith("cryptography.")] == []


def test_a_managed_identity_on_a_vm_loads_neither_azure_identity_nor_cryptography() -> None:
    # azure-identity and msal cost ~3.4 MB, and msal loads cryptography (issue 31).
    loaded = loaded_after(
        "from bridge.cloud.identity import credential\n"
        "from bridge.config import IdentitySettings\n"
        "credential(IdentitySettings(kind='managed', client_id='c'))"
    )
    heavy = ("azure.identity", "msal", "cryptography")
    assert [m for m in loaded if m.split(".")[0] in heavy or m.startswith(heavy)] == []
