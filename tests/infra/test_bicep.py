"""infra/'s Bicep: syntax, loaded files, alert parameters, app settings, roles and their scopes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge import config
from bridge.channels.storagequeue import queue_account, queue_name
from tests.support import bicep

INFRA = bicep.INFRA

MAIN = bicep.INFRA / "main.bicep"
MODULES = bicep.INFRA / "modules"
ALERTS = MODULES / "alerts.bicep"
FUNCTION_APP = MODULES / "functionapp.bicep"
CONSUMER_ROLES = MODULES / "consumer-roles.bicep"
VM = bicep.INFRA / "onboarding" / "vm.bicep"
DEPLOYING = bicep.ROOT / "docs" / "deploying.md"

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
    "b67fe603-310e-4889-b9ee-8257d09d353d": "Scheduled Events Contributor",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
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
    "Microsoft.Authorization/roleDefinitions": "2022-04-01",  # the patch-run cancel role
    "Microsoft.EventGrid/systemTopics": "2025-02-15",
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
    assert len(alerts) == 11
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
        "ask-pending.kql",
        "drain-blocked.kql",
        "pause-long.kql",
        "upcoming-budget-break.kql",
    }
    for file, name in replaced.items():
        first = (bicep.INFRA / "kql" / "alerts" / file).read_text(encoding="utf-8").splitlines()[0]
        assert re.fullmatch(rf"let {name} = .+;", first), f"{file} line 1 is {first!r}"


def test_the_upcoming_budget_break_alert_is_enabled_only_with_the_week_ahead() -> None:
    rules = {r["name"]: r for r in bicep.variables(ALERTS)["rules"]}
    assert rules["upcoming-budget-break"]["enabled"] == "weekAhead"
    assert all(r["enabled"] is True for n, r in rules.items() if n != "upcoming-budget-break")
    text = MAIN.read_text(encoding="utf-8")
    assert "param weekAhead bool = false" in text
    assert "weekAhead: weekAhead" in text
    assert "upcomingBudgetBreakDays: upcomingBudgetBreakDays" in text


def _conditional_settings(name: str) -> dict[str, object]:
    """The settings of `var name = CONDITION ? {} : {...}` (or `? {...} : {}`)."""
    operands = bicep.variables(FUNCTION_APP)[name]["operator"]["operands"]
    values = [operands["true_value"], operands["false_value"]]
    assert {} in values, f"{name} is not conditional"
    (settings,) = [v for v in values if v]
    assert isinstance(settings, dict)
    return settings


def _app_settings() -> dict[str, object]:
    settings = bicep.variables(FUNCTION_APP)["baseSettings"]
    assert isinstance(settings, dict)
    conditional = (
        "policySettings",
        "queueSettings",
        "peopleSettings",
        "notifySettings",
        "eventGridSettings",
        "weekAheadSettings",
    )
    for name in conditional:
        settings = settings | _conditional_settings(name)
    return settings


def test_every_settings_variable_is_applied() -> None:
    """A settings variable left out of the union would be a setting the tests see and Azure not."""
    text = FUNCTION_APP.read_text(encoding="utf-8")
    applied = (
        "baseSettings, policySettings, queueSettings, peopleSettings, notifySettings, "
        "eventGridSettings, weekAheadSettings"
    )
    assert f"properties: union({applied})" in text
    declared = {name for name in bicep.variables(FUNCTION_APP) if name.endswith("Settings")}
    assert declared == set(applied.split(", "))


# Sections other parts of issue 29 add to bridge/config.py ([consumer.people], [notify]) in
# parallel: their app settings are checked here as soon as the section exists.
COMING_SECTIONS = ("SE_BRIDGE_CONSUMER_PEOPLE_", "SE_BRIDGE_NOTIFY_")


def test_every_se_bridge_app_setting_is_a_real_setting() -> None:
    # A nested section ([consumer.people]) is spelled SE_BRIDGE_CONSUMER_PEOPLE_<KEY>.
    dotted = getattr(config, "dotted", lambda name: name)
    known = {
        f"SE_BRIDGE_{dotted(section.name).replace('.', '_').upper()}_{field.name.upper()}"
        for section in dataclasses.fields(config.Config)
        for field in dataclasses.fields(getattr(config.Config(), section.name))
    }
    missing = {p for p in COMING_SECTIONS if not any(k.startswith(p) for k in known)}
    for name in _app_settings():
        if name.startswith("SE_BRIDGE_") and "__" not in name:
            if any(name.startswith(prefix) for prefix in missing):
                continue
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


def test_queue_accounts_setting_lists_every_queue_account_only_when_there_are_several() -> None:
    """commands.queue_accounts: the accounts comma-separated; with one, storage.account alone."""
    assert "queue_accounts" in {f.name for f in dataclasses.fields(config.CommandsSettings)}
    variable = bicep.variables(FUNCTION_APP)["queueSettings"]["operator"]
    condition = variable["operands"]["condition"]["operator"]
    assert condition["type"] == "greater_than"
    assert condition["operands"]["operand_2"] == 1
    assert condition["operands"]["operand_1"]["function"] == {
        "type": "length",
        "parameters": {"arg_1": "queueAccountNames"},
    }
    assert variable["operands"]["false_value"] == {}
    value = variable["operands"]["true_value"]["SE_BRIDGE_COMMANDS_QUEUE_ACCOUNTS"]
    assert value["function"]["type"] == "join"
    assert value["function"]["parameters"] == {
        "input_array": "queueAccountNames",
        "delimiter": ",",
    }


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
    assert _roles(CONSUMER_ROLES) == {
        ("hub", "Azure Event Hubs Data Receiver"),
        ("account", "Storage Blob Data Owner"),
        ("account", "Storage Table Data Contributor"),
        ("queueAccounts[i]", "queueRole"),
        ("rule", "Monitoring Metrics Publisher"),
        ("insights", "Monitoring Metrics Publisher"),
        ("secret", "Key Vault Secrets User"),
        ("webhookSecret", "Key Vault Secrets User"),
    }
    queue_role = bicep.variables(CONSUMER_ROLES)["queueRole"]
    operands = queue_role["operator"]["operands"]
    assert (operands["true_value"], operands["false_value"]) == (
        "storageQueueDataContributor",
        "storageQueueDataMessageSender",
    )


def test_the_consumer_gets_its_queue_role_on_every_queue_account() -> None:
    """One assignment per queue account, over exactly the accounts main.bicep lists, the
    first keeping the name it had before the accounts were sharded (else Azure refuses the
    redeployment: the same role, principal and scope under a new name)."""
    found = bicep.parse(CONSUMER_ROLES)["resources"]
    accounts = found["queueAccounts"]
    assert accounts["existing"] is True
    assert bicep.loop(accounts["config"]) == {
        "type": "array",
        "detail": {"item_name": "name", "array_name": "queueAccountNames"},
    }
    sender = found["queueSender"]["config"]
    count = bicep.loop(sender)["detail"]["count"]  # type: ignore[index]
    assert bicep.loop(sender)["detail"]["start_index"] == 0  # type: ignore[index]
    assert count["function"]["parameters"] == {"arg_1": "queueAccountNames"}
    name = bicep.unlooped(sender)["name"]["function"]["parameters"]
    assert bicep.symbol(name["base_string"]["operator"]["operands"]["operand_1"]) == (
        "queueAccounts[i]"
    )
    assert list(name.values())[1:] == ["principalId", "queueRole"]
    # main.bicep gives every consumer every queue account, the main account first.
    for call in _main_calls("consumerRoles", "functionApp"):
        assert call["queueAccountNames"] == "queueAccountNames"
    names = bicep.variables(MAIN)["queueAccountNames"]
    assert bicep.loop(names) == _range(0, "queueAccountCount")
    operands = names["config"]["operator"]["operands"]
    assert operands["true_value"] == "storageAccountName"
    assert operands["false_value"]["function"]["type"] == "take"
    assert list(operands["false_value"]["function"]["parameters"].values()) == [
        "${prefix}q${i}${suffix}",
        24,
    ]


@pytest.mark.parametrize(
    "vm_id", ["1B1F7C1E-1234-4ABC-9DEF-00000000ABCD", " 02aab8a4-74ef-476e-8182-f6d2ba4166a6\n"]
)
def test_vm_queue_name_follows_the_agents_rule(vm_id: str) -> None:
    expression = bicep.variables(VM)["queueName"]
    assert expression == "${queuePrefix}${toLower(trim(vmId))}"
    # What that Bicep expression computes, in Python: Bicep's trim() strips whitespace.
    assert "se-bridge-" + vm_id.strip().lower() == queue_name("se-bridge-", vm_id)


def test_main_outputs_what_the_readme_uses() -> None:
    parsed = bicep.parse(MAIN)["outputs"]
    outputs = set(parsed)
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
        "queuePrefix",
        "consumerClientId",
        "workspaceId",
    } <= outputs
    # The shards: every namespace, app, rule and queue account, in index order.
    arrays = {
        "eventHubsNamespaces": ("eventHubs", "namespaceFqdn"),
        "eventHubsNamespaceNames": ("eventHubs", "namespaceName"),
        "functionAppNames": ("functionApp", "appName"),
    }
    for name, (module, output) in arrays.items():
        assert parsed[name]["type"] == "array"
        value = parsed[name]["value"]
        assert bicep.loop(value) == _range(0, "eventHubNamespaceCount"), name
        accessor = value["config"]["operator"]["operands"]
        assert bicep.symbol(accessor["operand_1"]) == f"{module}[i]", name
        assert accessor["operand_2"]["operator"]["operands"] == {
            "operand_1": "outputs",
            "operand_2": output,
        }
    assert parsed["queueStorageAccountNames"] == {
        "decorators": parsed["queueStorageAccountNames"]["decorators"],
        "type": "array",
        "value": "queueAccountNames",
    }
    for name in ("dataCollectionRuleNames", "dataCollectionRuleImmutableIds"):
        assert parsed[name]["type"] == "array"
    # The single outputs are the first shard's, as before sharding.
    text = MAIN.read_text(encoding="utf-8")
    for line in (
        "output eventHubsNamespace string = eventHubs[0].outputs.namespaceFqdn",
        "output eventHubsNamespaceName string = eventHubs[0].outputs.namespaceName",
        "output functionAppName string = functionApp[0].outputs.appName",
        "output consumerClientId string = functionApp[0].outputs.identityClientId",
        "output storageAccountName string = storage.outputs.accountName",
    ):
        assert line in text


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
        ("queues.bicep", {"account", "queueService"}),
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
    assert "deployDiagnostics ? workspace.outputs.workspaceId : ''" in main


def test_every_module_with_diagnostics_is_given_the_workspace() -> None:
    """A module whose diagnosticsWorkspaceId is left out (a default of '') sends nothing: the
    Function App's were, until the apps were sharded."""
    given = {}
    for path, _, target, params in _calls():
        if path == MAIN and "diagnosticsWorkspaceId" in bicep.parse(target)["parameters"]:
            given[target.name] = params.get("diagnosticsWorkspaceId")
    assert given == {
        "eventhubs.bicep": "diagnosticsWorkspaceId",
        "storage.bicep": "diagnosticsWorkspaceId",
        "queues.bicep": "diagnosticsWorkspaceId",
        "keyvault.bicep": "diagnosticsWorkspaceId",
        "functionapp.bicep": "diagnosticsWorkspaceId",
    }


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


def _module_names() -> list[tuple[Path, str]]:
    """(file, symbolic name) of every module call, read without parsing: a parametrize list
    is made in every test worker at collection, parsing is not (about 1 s per file)."""
    return [(path, name) for path in bicep.bicep_files()
            for name in _MODULE.findall(path.read_text(encoding="utf-8"))]  # fmt: skip


_MODULE = re.compile(r"^module\s+(\w+)\s+'", re.MULTILINE)


def test_the_module_calls_read_without_parsing_are_the_parsed_ones() -> None:
    assert _module_names() == [(path, name) for path, name, _, _ in _calls()]


@pytest.mark.parametrize("where", _module_names(), ids=lambda w: f"{w[0].name}:{w[1]}")
def test_a_module_is_given_exactly_the_parameters_it_declares(where: tuple[Path, str]) -> None:
    """What the Bicep compiler would refuse (no compiler here): an argument the module does
    not declare, or a parameter without a default left out."""
    [(_, _, target, given)] = [c for c in _calls() if (c[0], c[1]) == where]
    declared = bicep.parse(target)["parameters"]
    assert sorted(set(given) - set(declared)) == []
    required = {name for name, p in declared.items() if p.get("default") is None}
    assert sorted(required - set(given)) == []


# Sharding (issue 15): namespaces, Function Apps and queue accounts, as ingestionRuleCount does
# for data collection rules. Index 0 keeps the names of an unsharded deployment.


def _range(start: int, count: object) -> dict[str, object]:
    """pycep's loop of `[for i in range(start, count): ...]`."""
    detail = {"item_name": None, "index_name": "i", "start_index": start, "count": count}
    return {"type": "range", "detail": detail}


def _main_module(name: str) -> dict[str, Any]:
    module: dict[str, Any] = bicep.parse(MAIN)["modules"][name]
    return module


def _main_calls(*names: str) -> list[dict[str, Any]]:
    """The parameters main.bicep gives each named module."""
    return [bicep.unlooped(_main_module(name)["config"])["params"] for name in names]


def _accessor(expression: dict[str, Any]) -> str:
    """`eventHubs[i].outputs.namespaceFqdn` of pycep's property accessors, as written."""
    operator = expression["operator"]
    if operator["type"] == "index_accessor":
        return bicep.symbol(expression)
    assert operator["type"] == "property_accessor", expression
    left, right = operator["operands"]["operand_1"], operator["operands"]["operand_2"]
    left = left if isinstance(left, str) else _accessor(left)
    right = right if isinstance(right, str) else _accessor(right)
    return f"{left}.{right}"


def _ternary(expression: dict[str, Any]) -> tuple[object, object]:
    """(value at i == 0, value otherwise) of `(i == 0) ? a : b`."""
    operands = expression["operator"]["operands"]
    assert operands["condition"] == {
        "operator": {"type": "equals", "operands": {"operand_1": "i", "operand_2": 0}}
    }
    return operands["true_value"], operands["false_value"]


@pytest.mark.parametrize(
    "name", ["eventHubNamespaceCount", "queueAccountCount", "ingestionRuleCount"]
)
def test_shard_counts_are_1_to_20_and_1_by_default(name: str) -> None:
    parameter = bicep.parse(MAIN)["parameters"][name]
    assert parameter["type"] == "int"
    assert parameter["default"] == 1  # an existing deployment does not change
    decorators = {d["type"]: d["argument"] for d in parameter["decorators"]}
    assert (decorators["min_value"], decorators["max_value"]) == (1, 20)
    assert "docs/capacity.md#azure-quotas" in decorators["description"]


@pytest.mark.parametrize(
    ("module", "loop", "deployment"),
    [
        ("eventHubs", _range(0, "eventHubNamespaceCount"), "se-bridge-eventhubs"),
        ("functionApp", _range(0, "eventHubNamespaceCount"), "se-bridge-functionapp"),
        ("consumerRoles", _range(0, "eventHubNamespaceCount"), "se-bridge-consumer-roles"),
    ],
)
def test_one_namespace_app_and_role_set_per_shard_index_0_named_as_before(
    module: str, loop: dict[str, object], deployment: str
) -> None:
    config = _main_module(module)["config"]
    assert bicep.loop(config) == loop
    assert _ternary(bicep.unlooped(config)["name"]) == (deployment, f"{deployment}-${{i}}")


def test_shard_names_keep_index_0_as_it_was() -> None:
    (hubs, apps) = _main_calls("eventHubs", "functionApp")
    assert _ternary(hubs["namespaceName"]) == ("${prefix}-${suffix}", "${prefix}-${suffix}-${i}")
    assert _ternary(apps["appName"]) == ("functionAppName", "${functionAppName}-${i}")
    # Accounts 1.. are queue-only; account 0 is storage.bicep's (test above: queueAccountNames).
    queues = _main_module("queueStorage")["config"]
    minus_one = {"operand_1": "queueAccountCount", "operand_2": 1}
    assert bicep.loop(queues) == _range(
        1, {"operator": {"type": "substract", "operands": minus_one}}
    )
    assert bicep.unlooped(queues)["name"] == "se-bridge-queues-${i}"
    assert _main_calls("queueStorage")[0]["accountName"] == {
        "operator": {
            "type": "index_accessor",
            "operands": {"operand_1": "queueAccountNames", "operand_2": "i"},
        }
    }
    # The consumers' roles name the queue accounts rather than use module outputs: they wait.
    assert bicep.unlooped(_main_module("consumerRoles")["config"])["dependsOn"] == ["queueStorage"]


@pytest.mark.parametrize("prefix", ["sebridge", "se"])
@pytest.mark.parametrize("suffix", ["abc123", "x1y2"])
def test_queue_account_names_are_valid_and_distinct(prefix: str, suffix: str) -> None:
    """main.bicep's queueAccountNames (checked above) for default-sized names, 20 accounts."""
    names = [f"{prefix}{suffix}"[:24]] + [f"{prefix}q{i}{suffix}"[:24] for i in range(1, 20)]
    assert len(set(names)) == 20
    for name in names:
        assert re.fullmatch(r"[a-z0-9]{3,24}", name), name


def test_each_app_reads_its_own_namespace_and_shares_the_rest() -> None:
    (app,) = _main_calls("functionApp")
    own = {
        "eventHubsNamespaceFqdn": "eventHubs[i].outputs.namespaceFqdn",
        "eventHubName": "eventHubs[i].outputs.eventHubName",
        "consumerGroupName": "eventHubs[i].outputs.consumerGroupName",
        # Flex Consumption: one package container per app.
        "deploymentContainerName": "storage.outputs.deploymentContainerNames[i]",
    }
    shared = {
        "storageAccountName": "storage.outputs.accountName",
        "blobEndpoint": "storage.outputs.blobEndpoint",
        "fleetTableName": "storage.outputs.fleetTableName",
        "signingKeySecretUri": "keyVault.outputs.secretUri",
        "workspaceId": "workspace.outputs.workspaceId",
        "logsIngestionEndpoint": "ingestion.outputs.logsIngestionEndpoint",
        "dataCollectionRuleImmutableId": "ingestion.outputs.ruleImmutableId",
    }
    for name, value in (own | shared).items():
        assert _accessor(app[name]) == value, name
    assert app["queueAccountNames"] == "queueAccountNames"
    (roles,) = _main_calls("consumerRoles")
    for name, value in {
        "principalId": "functionApp[i].outputs.identityPrincipalId",
        "insightsName": "functionApp[i].outputs.insightsName",
        "eventHubsNamespaceName": "eventHubs[i].outputs.namespaceName",
        "eventHubName": "eventHubs[i].outputs.eventHubName",
        "storageAccountName": "storage.outputs.accountName",
        "dataCollectionRuleName": "ingestion.outputs.ruleName",
        "keyVaultName": "keyVault.outputs.vaultName",
        "signingKeySecretName": "keyVault.outputs.secretName",
    }.items():
        assert _accessor(roles[name]) == value, name
    (storage,) = _main_calls("storage")
    assert storage["deploymentContainerCount"] == "eventHubNamespaceCount"
    containers = bicep.resources(
        MODULES / "storage.bicep", "Microsoft.Storage/storageAccounts/blobServices/containers"
    )["deploymentContainers"]["config"]
    assert bicep.loop(containers) == _range(0, "deploymentContainerCount")
    assert _ternary(bicep.unlooped(containers)["name"]) == (
        "deploymentContainerName",
        "${deploymentContainerName}-${i}",
    )


def test_a_looped_module_is_used_only_by_index() -> None:
    """`eventHubs.outputs` of a module array is what the compiler refuses; dependsOn may name it."""
    looped = [
        name
        for name, module in bicep.parse(MAIN)["modules"].items()
        if bicep.loop(module["config"])
    ]
    assert sorted(looped) == [
        "armAcknowledge",
        "consumerRoles",
        "eventHubs",
        "functionApp",
        "queueStorage",
        "resourceGraphReader",
        "weekAheadReader",
    ]
    text = MAIN.read_text(encoding="utf-8")
    for name in looped:
        assert not re.search(rf"\b{name}\.", text), name
        for index in re.findall(rf"\b{name}\[(\w+)\]", text):
            assert index in ("i", "0"), f"{name}[{index}]"


def test_module_calls_in_loops_are_checked_for_their_parameters() -> None:
    """The parameter check above sees looped calls, and a looped call passes every parameter
    of its module but those left to their defaults on purpose."""
    calls = {name: params for path, name, _, params in _calls() if path == MAIN}
    for name, target in (
        ("eventHubs", "eventhubs.bicep"),
        ("functionApp", "functionapp.bicep"),
        ("consumerRoles", "consumer-roles.bicep"),
        ("queueStorage", "queues.bicep"),
    ):
        declared = set(bicep.parse(MODULES / target)["parameters"])
        defaults = {
            "eventHubs": {"messageRetentionInDays", "capacity"},
            "functionApp": {"maximumInstanceCount", "instanceMemoryMB"},
            "consumerRoles": set(),
            "queueStorage": {"skuName"},
        }[name]
        assert set(calls[name]) == declared - defaults, name


def test_queue_accounts_have_the_main_accounts_security_settings() -> None:
    def account(path: Path) -> dict[str, Any]:
        res = bicep.resources(path, "Microsoft.Storage/storageAccounts")["account"]
        config: dict[str, Any] = res["config"]
        return config

    main, queues = account(MODULES / "storage.bicep"), account(MODULES / "queues.bicep")
    assert queues["properties"] == main["properties"]
    assert queues["kind"] == main["kind"] == "StorageV2"
    assert queues["properties"]["allowSharedKeyAccess"] is False
    assert queues["properties"]["allowBlobPublicAccess"] is False
    assert queues["properties"]["minimumTlsVersion"] == "TLS1_2"
    storage = bicep.parse(MODULES / "storage.bicep")["parameters"]["skuName"]
    assert bicep.parse(MODULES / "queues.bicep")["parameters"]["skuName"] == storage


def _docs_snippet() -> str:
    text = DEPLOYING.read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    (snippet,) = [b for b in blocks if "pick()" in b]
    return str(snippet)


@pytest.mark.skipif(shutil.which("jq") is None, reason="the docs' snippet needs jq")
@pytest.mark.parametrize(
    "vm_id",
    [
        "1B1F7C1E-1234-4ABC-9DEF-00000000ABCD",
        "ffffffff-74ef-476e-8182-f6d2ba4166a6",
        "00000007-0000-0000-0000-000000000000",
    ],
)
def test_the_docs_pick_each_vms_shards_by_the_consumers_rule(tmp_path: Path, vm_id: str) -> None:
    """docs/deploying.md's shell lines, run against a fake `az`, pick the namespace, rule and
    queue account bridge's queue_account picks (the consumer's commands.queue_accounts)."""
    outputs = {
        "eventHubsNamespaceNames": [f"sebridge-abc123-{i}" for i in range(7)],
        "eventHubsNamespaces": [f"sebridge-abc123-{i}.servicebus.windows.net" for i in range(7)],
        "dataCollectionRuleNames": [f"sebridge-dcr-abc123-{i}" for i in range(3)],
        "dataCollectionRuleImmutableIds": [f"dcr-{i:032x}" for i in range(3)],
        "queueStorageAccountNames": ["sebridgeabc123"]
        + [f"sebridgeq{i}abc123" for i in range(1, 11)],
    }
    (tmp_path / "outputs.json").write_text(json.dumps(outputs), encoding="utf-8")
    fake = tmp_path / "az"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "query = args[args.index('--query') + 1]\n"
        f"if args[:2] == ['vm', 'show']:\n    print({vm_id!r})\n"
        "else:\n"
        f"    outputs = json.load(open({str(tmp_path / 'outputs.json')!r}))\n"
        "    print(json.dumps(outputs[query.split('.')[2]]))\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    script = (
        "set -eu\nRG=rg VM_RG=app VM=web-0\n"
        + _docs_snippet()
        + 'printf "%s\\n" "$EH_NAME" "$EH_FQDN" "$DCR_NAME" "$DCR_ID" "$QUEUE_ACCOUNT"\n'
    )
    env = os.environ | {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, check=True, timeout=60
    )
    expected = [
        queue_account(vm_id, outputs[name])
        for name in (
            "eventHubsNamespaceNames",
            "eventHubsNamespaces",
            "dataCollectionRuleNames",
            "dataCollectionRuleImmutableIds",
            "queueStorageAccountNames",
        )
    ]
    assert done.stdout.splitlines() == expected
