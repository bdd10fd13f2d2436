"""infra/'s Bicep: syntax, loaded files, alert parameters, app settings, roles and their scopes."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bridge import config
from bridge.channels.storagequeue import queue_name
from tests.infra import bicep_support as bicep

INFRA = bicep.INFRA

MODULES = bicep.INFRA / "modules"
ALERTS = MODULES / "alerts.bicep"
FUNCTION_APP = MODULES / "functionapp.bicep"
VM = bicep.INFRA / "onboarding" / "vm.bicep"

# The built-in roles se-bridge assigns (Azure built-in roles reference), id -> name.
BUILT_IN_ROLES = {
    "2b629674-e913-4c01-ae53-ef4638d8f975": "Azure Event Hubs Data Sender",
    "a638d3c7-ab3a-418d-83e6-5f17a39d4fde": "Azure Event Hubs Data Receiver",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "8a0f0c08-91a1-4084-bc3d-661d67233fed": "Storage Queue Data Message Processor",
    "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a": "Storage Queue Data Message Sender",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
}


def _ids(path: Path) -> str:
    return str(path.relative_to(bicep.INFRA))


@pytest.mark.parametrize("path", bicep.bicep_files(), ids=_ids)
def test_every_bicep_file_parses(path: Path) -> None:
    parsed = bicep.parse(path)
    assert parsed.get("resources") or parsed.get("modules")


# The API version of each resource type: its newest stable one in Azure/bicep-types-az (what
# the Bicep compiler checks properties against) when this was last reviewed, 2026-11-26. A
# preview only where no stable version can express the resource (the reason is in the file).
API_VERSIONS = {
    "Microsoft.Authorization/roleAssignments": "2022-04-01",
    "Microsoft.EventHub/namespaces": "2026-01-01",
    "Microsoft.Insights/components": "2020-02-02",
    "Microsoft.Insights/dataCollectionEndpoints": "2024-03-11",
    "Microsoft.Insights/dataCollectionRules": "2024-03-11",
    "Microsoft.Insights/diagnosticSettings": "2021-05-01-preview",
    "Microsoft.Insights/scheduledQueryRules": "2026-03-01",
    "Microsoft.Insights/workbooks": "2023-06-01",
    "Microsoft.KeyVault/vaults": "2026-02-01",
    "Microsoft.ManagedIdentity/userAssignedIdentities": "2024-11-30",
    "Microsoft.OperationalInsights/workspaces": "2026-03-01",
    "Microsoft.Storage/storageAccounts": "2026-04-01",
    "Microsoft.Web/serverfarms": "2025-03-01",
    "Microsoft.Web/sites": "2025-03-01",
}
_RESOURCE = re.compile(r"^resource \w+ '([\w./]+)@([\w-]+)'", re.MULTILINE)


@pytest.mark.parametrize("path", bicep.bicep_files(), ids=_ids)
def test_every_resource_type_is_on_its_reviewed_api_version(path: Path) -> None:
    """A child type goes with its parent's version (Storage's queues with its accounts)."""
    used = _RESOURCE.findall(path.read_text(encoding="utf-8"))
    assert used or path.name == "main.bicep"
    for kind, version in used:
        parent = "/".join(kind.split("/")[:2])
        assert version == API_VERSIONS[parent], f"{kind}@{version}"
        if version.endswith("-preview"):
            assert f"stay on {version}" in path.read_text(encoding="utf-8"), kind


def test_the_parser_refuses_broken_bicep() -> None:
    good = (MODULES / "eventhubs.bicep").read_text(encoding="utf-8")
    bicep.parse_text(good)
    with pytest.raises(Exception, match=r"(?i)unexpected|invalid"):
        bicep.parse_text(
            good.replace("partitionCount: partitionCount", "partitionCount partitionCount")
        )


@pytest.mark.parametrize("path", bicep.bicep_files(), ids=_ids)
def test_every_loaded_file_exists(path: Path) -> None:
    for loaded in bicep.loaded_files(path):
        assert loaded.is_file(), f"{_ids(path)} loads {loaded}, which does not exist"


def test_loaded_files_are_found() -> None:
    kql = bicep.INFRA / "kql"
    alerts = {p.resolve() for p in (kql / "alerts").glob("*.kql")}
    assert len(alerts) == 6
    assert set(bicep.loaded_files(ALERTS)) == alerts  # one rule per alert query, no more
    assert (kql / "dcr-transform.kql").resolve() in bicep.loaded_files(MODULES / "ingestion.bicep")
    workbook = (bicep.INFRA / "workbook" / "se-bridge.workbook.json").resolve()
    assert bicep.loaded_files(MODULES / "workbook.bicep") == [workbook]


def _replacements() -> dict[str, str]:
    """Alert file name -> the parameter its line 1 is replaced with in alerts.bicep."""
    text = ALERTS.read_text(encoding="utf-8")
    pairs = re.findall(r"var (\w+)Text = loadTextContent\('\.\./kql/alerts/([\w-]+\.kql)'\)", text)
    out = {}
    for prefix, file in pairs:
        query = re.search(rf"var {prefix}Query = 'let (\w+) = \$\{{\w+\}}\w*;\\n", text)
        assert query, f"{prefix}Query does not replace line 1 of {file}"
        out[file] = query.group(1)
    return out


def test_parameterised_alerts_replace_their_first_line_with_the_same_name() -> None:
    replaced = _replacements()
    assert set(replaced) == {
        "approval-overdue.kql",
        "heartbeat-missing.kql",
        "spool-backlog-growing.kql",
        "preempt-spike.kql",
    }
    for file, name in replaced.items():
        first = (bicep.INFRA / "kql" / "alerts" / file).read_text(encoding="utf-8").splitlines()[0]
        assert re.fullmatch(rf"let {name} = .+;", first), f"{file} line 1 is {first!r}"


def _app_settings() -> dict[str, object]:
    settings = bicep.variables(FUNCTION_APP)["baseSettings"]
    extra = bicep.variables(FUNCTION_APP)["policySettings"]
    assert isinstance(settings, dict)
    return settings | {"SE_BRIDGE_CONSUMER_POLICY": extra}


def test_every_se_bridge_app_setting_is_a_real_setting() -> None:
    known = {
        f"SE_BRIDGE_{section.name.upper()}_{field.name.upper()}"
        for section in dataclasses.fields(config.Config)
        for field in dataclasses.fields(getattr(config.Config(), section.name))
    }
    for name in _app_settings():
        if name.startswith("SE_BRIDGE_") and "__" not in name:
            assert name in known, f"{name} is no se-bridge setting"


def test_app_settings_are_those_the_readme_requires() -> None:
    settings = _app_settings()
    required = {
        "SE_BRIDGE_EVENTHUBS__fullyQualifiedNamespace",
        "SE_BRIDGE_EVENTHUBS__credential",
        "SE_BRIDGE_EVENTHUBS__clientId",
        "SE_BRIDGE_EVENTHUBS_NAME",
        "SE_BRIDGE_CONSUMER_CONSUMER_GROUP",
        "AzureWebJobsStorage__accountName",
        "SE_BRIDGE_CONSUMER_STATE",
        "SE_BRIDGE_COMMANDS_CHANNEL",
        "SE_BRIDGE_STORAGE_ACCOUNT",
        "SE_BRIDGE_IDENTITY_KIND",
        "SE_BRIDGE_IDENTITY_CLIENT_ID",
        "SE_BRIDGE_LOGANALYTICS_ENDPOINT",
        "SE_BRIDGE_LOGANALYTICS_RULE_ID",
        "SE_BRIDGE_COMMANDS_SIGNING_KEY",
    }
    assert required <= set(settings)
    assert settings["SE_BRIDGE_CONSUMER_STATE"] == "tables"
    assert settings["SE_BRIDGE_COMMANDS_CHANNEL"] == "storagequeue"
    assert settings["SE_BRIDGE_IDENTITY_KIND"] == "managed"
    assert settings["SE_BRIDGE_EVENTHUBS__credential"] == "managedidentity"
    assert settings["SE_BRIDGE_COMMANDS_SIGNING_KEY"] == "keyvault:${signingKeySecretUri}"
    # No shared key anywhere: no connection strings.
    assert "AzureWebJobsStorage" not in settings
    assert "SE_BRIDGE_EVENTHUBS" not in settings


@pytest.mark.parametrize("path", bicep.bicep_files(), ids=_ids)
def test_role_ids_are_the_built_in_roles_they_name(path: Path) -> None:
    for name, (guid, role) in bicep.role_variables(path).items():
        assert BUILT_IN_ROLES.get(guid) == role, f"{_ids(path)}: {name} = {guid} is not {role}"


def _roles(path: Path) -> set[tuple[str, str]]:
    names = bicep.role_variables(path)
    out = set()
    for _, scope, var in bicep.role_assignments(path):
        role = names[var][1] if var in names else var
        out.add((scope, role))
    return out


def test_each_vm_gets_three_roles_on_its_own_resources_only() -> None:
    assert _roles(VM) == {
        ("queue", "Storage Queue Data Message Processor"),
        ("hub", "Azure Event Hubs Data Sender"),
        ("rule", "Monitoring Metrics Publisher"),
    }
    queue = bicep.resources(VM, "Microsoft.Storage/storageAccounts/queueServices/queues")["queue"]
    assert queue["config"]["name"] == "queueName"


def test_the_consumer_gets_what_it_uses() -> None:
    assert _roles(MODULES / "consumer-roles.bicep") == {
        ("hub", "Azure Event Hubs Data Receiver"),
        ("account", "Storage Blob Data Owner"),
        ("account", "Storage Table Data Contributor"),
        ("account", "queueRole"),
        ("rule", "Monitoring Metrics Publisher"),
        ("insights", "Monitoring Metrics Publisher"),
        ("secret", "Key Vault Secrets User"),
    }
    queue_role = bicep.variables(MODULES / "consumer-roles.bicep")["queueRole"]
    operands = queue_role["operator"]["operands"]
    assert (operands["true_value"], operands["false_value"]) == (
        "storageQueueDataContributor",
        "storageQueueDataMessageSender",
    )


@pytest.mark.parametrize(
    "vm_id", ["1B1F7C1E-1234-4ABC-9DEF-00000000ABCD", " 02aab8a4-74ef-476e-8182-f6d2ba4166a6\n"]
)
def test_vm_queue_name_follows_the_agents_rule(vm_id: str) -> None:
    expression = bicep.variables(VM)["queueName"]
    assert expression == "${queuePrefix}${toLower(trim(vmId))}"
    # What that Bicep expression computes, in Python: Bicep's trim() strips whitespace.
    assert "se-bridge-" + vm_id.strip().lower() == queue_name("se-bridge-", vm_id)


def test_main_outputs_what_the_readme_uses() -> None:
    outputs = set(bicep.parse(bicep.INFRA / "main.bicep")["outputs"])
    assert {
        "eventHubsNamespace",
        "eventHubName",
        "eventHubsNamespaceName",
        "logsIngestionEndpoint",
        "dataCollectionRuleImmutableId",
        "dataCollectionRuleName",
        "storageAccountName",
        "functionAppName",
        "keyVaultUri",
        "signingKeySetting",
    } <= outputs


def test_the_bicep_linter_runs_the_community_rules() -> None:
    config = json.loads((INFRA / "bicepconfig.json").read_text(encoding="utf-8"))
    core = config["analyzers"]["core"]
    assert core["enabled"] is True
    for rule in (
        "no-hardcoded-env-urls",
        "secure-parameter-default",
        "outputs-should-not-contain-secrets",
        "use-secure-value-for-secure-inputs",
    ):
        assert core["rules"][rule]["level"] == "error", rule  # fmt: skip
    assert core["rules"]["use-recent-api-versions"]["level"] in ("warning", "error")


def test_the_example_parameters_file_sets_real_parameters_and_every_required_one() -> None:
    text = (INFRA / "main.bicepparam").read_text(encoding="utf-8")
    assert "using './main.bicep'" in text
    given = set(re.findall(r"^param (\w+) =", text, flags=re.MULTILINE))
    main = (INFRA / "main.bicep").read_text(encoding="utf-8")
    declared = dict(re.findall(r"^param (\w+) \w+(.*)$", main, flags=re.MULTILINE))
    assert given <= declared.keys(), given - declared.keys()
    required = {name for name, rest in declared.items() if "=" not in rest}
    assert required <= given, required - given
    assert "readEnvironmentVariable('SE_BRIDGE_SIGNING_KEY_PEM')" in text  # a secret, not a value


@pytest.mark.parametrize(
    ("module", "scopes"),
    [
        ("eventhubs.bicep", {"namespace"}),
        ("keyvault.bicep", {"vault"}),
        ("storage.bicep", {"account", "blobService", "queueService", "tableService"}),
        ("functionapp.bicep", {"app"}),
    ],
)
def test_diagnostic_settings_send_each_resources_logs_to_the_workspace(
    module: str, scopes: set[str]
) -> None:
    text = (INFRA / "modules" / module).read_text(encoding="utf-8")
    blocks = re.findall(
        r"resource \w+ 'Microsoft\.Insights/diagnosticSettings@[\w-]+' = "
        r"if \(!empty\(diagnosticsWorkspaceId\)\) \{(.*?)\n\}",
        text,
        flags=re.DOTALL,
    )
    assert {re.search(r"scope: (\w+)", b).group(1) for b in blocks} == scopes  # type: ignore[union-attr]
    for block in blocks:
        assert "workspaceId: diagnosticsWorkspaceId" in block
    main = (INFRA / "main.bicep").read_text(encoding="utf-8")
    assert main.count("diagnosticsWorkspaceId: diagnosticsWorkspaceId") == 3
    assert "deployDiagnostics ? workspace.outputs.workspaceId : ''" in main


def _calls() -> list[tuple[Path, str, Path, dict[str, object]]]:
    found = []
    for path in bicep.bicep_files():
        for name, module in (bicep.parse(path).get("modules") or {}).items():
            if module["type"] == "local":
                target = (path.parent / module["detail"]["path"]).resolve()
                config = module["config"]
                config = config.get("config", config)  # `= if (condition) {...}`
                found.append((path, name, target, config.get("params") or {}))
    return found


@pytest.mark.parametrize("call", _calls(), ids=lambda c: f"{c[0].name}:{c[1]}")
def test_a_module_is_given_exactly_the_parameters_it_declares(
    call: tuple[Path, str, Path, dict[str, object]],
) -> None:
    """What the Bicep compiler would refuse (no compiler here): an argument the module does
    not declare, or a parameter without a default left out."""
    _, _, target, given = call
    declared = bicep.parse(target)["parameters"]
    assert sorted(set(given) - set(declared)) == []
    required = {name for name, p in declared.items() if p.get("default") is None}
    assert sorted(required - set(given)) == []
