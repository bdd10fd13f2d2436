"""infra/ for people in the loop (issue 29): the app role, App Service Authentication in front of
the approval page and API, the consumer's people and notify settings, and the webhook secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import bicep

MODULES = bicep.INFRA / "modules"
FUNCTION_APP = MODULES / "functionapp.bicep"
KEY_VAULT = MODULES / "keyvault.bicep"
CONSUMER_ROLES = MODULES / "consumer-roles.bicep"
MAIN = bicep.INFRA / "main.bicep"
PEOPLE = bicep.INFRA / "people"
SCRIPT = PEOPLE / "decide-app.sh"
ROLE = "SeBridge.Decide"
# The well-known client ids of the Azure CLI (and the Azure Developer CLI) and Azure PowerShell,
# whose sign-ins `se-bridge approve` takes a token from (DefaultAzureCredential).
AZURE_TOOLS = ("04b07795-8ddb-461a-bbee-02f9e1bf7b46", "1950a258-227b-4e31-a9cf-717495945fc2")


def _not_empty(parameter: str) -> dict[str, Any]:
    """pycep's `!empty(parameter)`."""
    empty = {"function": {"type": "empty", "parameters": {"item_to_test": parameter}}}
    return {"operator": {"type": "not", "operands": {"bool_value": empty}}}


def _conditional(path: Path, kind: str, name: str, parameter: str) -> dict[str, Any]:
    """A resource's properties, after checking it is deployed only when `parameter` is set."""
    config = bicep.resources(path, kind)[name]["config"]
    assert config["condition"] == _not_empty(parameter)
    inner: dict[str, Any] = config["config"]
    return inner


def _settings(name: str, parameter: str) -> dict[str, Any]:
    """`var name = empty(parameter) ? {} : {...}`: the settings, only when parameter is set."""
    operands = bicep.variables(FUNCTION_APP)[name]["operator"]["operands"]
    assert operands["condition"]["function"] == {
        "type": "empty",
        "parameters": {"item_to_test": parameter},
    }
    assert operands["true_value"] == {}
    settings: dict[str, Any] = operands["false_value"]
    return settings


def test_app_service_authentication_with_entra_id_guards_every_http_request() -> None:
    auth = _conditional(FUNCTION_APP, "Microsoft.Web/sites/config", "auth", "peopleClientId")
    assert (auth["parent"], auth["name"]) == ("app", "authsettingsV2")
    props = auth["properties"]
    assert props["platform"] == {"enabled": True}
    assert props["globalValidation"] == {
        "requireAuthentication": True,
        "unauthenticatedClientAction": "RedirectToLoginPage",
        "redirectToProvider": "azureactivedirectory",
    }
    entra = props["identityProviders"]["azureActiveDirectory"]
    assert entra["enabled"] is True
    assert entra["registration"] == {
        "clientId": "peopleClientId",
        # The cloud's own login endpoint (no hard-coded URL), the tenant's v2.0 issuer.
        "openIdIssuer": "${environment().authentication.loginEndpoint}${peopleTenantId}/v2.0",
    }
    # A token for the Application ID URI (the CLI's) or for the client id (the page's).
    assert entra["validation"]["allowedAudiences"] == ["api://${peopleClientId}", "peopleClientId"]
    assert props["login"]["tokenStore"] == {"enabled": True}
    assert props["httpSettings"]["requireHttps"] is True
    # Only HTTP requests meet App Service Authentication: nothing to exclude for the trigger.
    assert "excludedPaths" not in props["globalValidation"]


def test_the_consumer_accepts_the_same_tenant_and_audiences_as_app_service_authentication() -> None:
    assert _settings("peopleSettings", "peopleClientId") == {
        "SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID": "peopleTenantId",
        "SE_BRIDGE_CONSUMER_PEOPLE_AUDIENCE": "api://${peopleClientId},${peopleClientId}",
    }


def test_the_webhook_url_reaches_the_consumer_only_through_key_vault() -> None:
    settings = _settings("notifySettings", "webhookSecretName")
    targets = settings["SE_BRIDGE_NOTIFY_TARGETS"]["function"]
    assert targets["type"] == "string"  # JSON, as notify.targets takes from the environment
    (target,) = targets["parameters"]["value_to_convert"]
    assert target == {
        "name": "notifyTargetName",
        "kind": "notifyTargetKind",
        "url_secret": "webhookSecretName",
    }
    assert settings["SE_BRIDGE_NOTIFY_KEY_VAULT"] == "keyVaultUri"
    page = settings["SE_BRIDGE_NOTIFY_PAGE_URL"]["operator"]["operands"]
    assert (page["true_value"], page["false_value"]) == (
        "",
        "https://${app.properties.defaultHostName}/",
    )
    kinds = bicep.parse(FUNCTION_APP)["parameters"]["notifyTargetKind"]["decorators"]
    assert {"type": "allowed", "argument": ["generic", "teams", "slack"]} in kinds


def test_the_webhook_url_is_a_secure_parameter_stored_as_a_secret_and_never_output() -> None:
    for path, name in ((KEY_VAULT, "webhookUrl"), (MAIN, "notifyWebhookUrl")):
        parameter = bicep.parse(path)["parameters"][name]
        assert {"type": "secure"} in parameter["decorators"], path.name
        assert parameter["default"] == "", path.name  # optional: no webhook, no secret
        for output in bicep.parse(path)["outputs"].values():
            assert name not in json.dumps(output["value"]), path.name
    secret = _conditional(
        KEY_VAULT, "Microsoft.KeyVault/vaults/secrets", "webhookSecret", "webhookUrl"
    )
    assert secret["properties"]["value"] == "webhookUrl"
    assert secret["parent"] == "vault"


def test_the_consumer_may_read_the_webhook_secret_and_nothing_else_in_the_vault() -> None:
    secret = _conditional(
        CONSUMER_ROLES, "Microsoft.KeyVault/vaults/secrets", "webhookSecret", "webhookSecretName"
    )
    assert (secret["parent"], secret["name"]) == ("vault", "webhookSecretName")
    assert bicep.resources(CONSUMER_ROLES, "Microsoft.KeyVault/vaults/secrets")["webhookSecret"][
        "existing"
    ]
    grant = _conditional(
        CONSUMER_ROLES,
        "Microsoft.Authorization/roleAssignments",
        "webhookSecretUser",
        "webhookSecretName",
    )
    assert grant["scope"] == "webhookSecret"
    role = grant["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]
    assert bicep.role_variables(CONSUMER_ROLES)[role][1] == "Key Vault Secrets User"


def test_main_passes_the_webhook_secret_on_only_when_a_webhook_url_was_given() -> None:
    modules = bicep.parse(MAIN)["modules"]

    def params(name: str) -> dict[str, Any]:
        found: dict[str, Any] = bicep.unlooped(modules[name]["config"])["params"]
        return found

    assert params("keyVault")["webhookUrl"] == "notifyWebhookUrl"
    for module in ("functionApp", "consumerRoles"):
        operands = params(module)["webhookSecretName"]["operator"]["operands"]
        assert operands["condition"]["function"]["parameters"] == {
            "item_to_test": "notifyWebhookUrl"
        }
        assert operands["true_value"] == ""
        accessor = operands["false_value"]["operator"]["operands"]
        assert accessor["operand_2"]["operator"]["operands"]["operand_2"] == "webhookSecretName"
    assert params("functionApp")["peopleClientId"] == "peopleClientId"
    assert params("functionApp")["peopleTenantId"] == "peopleTenantId"


def test_the_app_role_is_sebridge_decide_for_people() -> None:
    (role,) = json.loads((PEOPLE / "app-roles.json").read_text(encoding="utf-8"))
    assert role["value"] == ROLE
    assert role["allowedMemberTypes"] == ["User"]  # people and groups, not applications
    assert role["isEnabled"] is True
    scope = json.loads((PEOPLE / "api-scope.json").read_text(encoding="utf-8"))["api"]
    (permission,) = scope["oauth2PermissionScopes"]
    preauthorized = json.loads((PEOPLE / "api-preauthorized.json").read_text(encoding="utf-8"))
    assert preauthorized["api"]["preAuthorizedApplications"] == [
        {"appId": tool, "delegatedPermissionIds": [permission["id"]]} for tool in AZURE_TOOLS
    ]
    assert scope["requestedAccessTokenVersion"] == 2


# A fake `az` for decide-app.sh: it answers from a state file (the directory as it stands) and
# logs every call, with the JSON bodies it was given, so the test sees what would change.
FAKE_AZ = """
import json, sys
from pathlib import Path
here = Path(sys.argv[0])
state_path, log_path = here.with_name("state.json"), here.with_name("calls.jsonl")
state = json.loads(state_path.read_text())
args = sys.argv[1:]

def value(flag):
    return args[args.index(flag) + 1] if flag in args else None

def body(flag):
    raw = value(flag)
    if raw is None:
        return None
    return json.loads(Path(raw[1:]).read_text() if raw.startswith("@") else raw)

call = {"args": args, "roles": body("--app-roles"), "body": body("--body")}
with log_path.open("a") as log:
    log.write(json.dumps(call) + "\\n")
out = ""
if args[:3] == ["ad", "app", "list"]:
    out = state.get("app_id", "")
elif args[:3] == ["ad", "app", "create"]:
    state["app_id"], state["roles"] = "1d1e5e55-0000-4000-8000-00000000a99d", call["roles"]
    out = state["app_id"]
elif args[:3] == ["ad", "app", "update"] and call["roles"]:
    state["roles"] = call["roles"]
elif args[:3] == ["ad", "app", "show"]:
    query = value("--query")
    out = "0b1ec7a9-0000-4000-8000-000000000001" if query == "id" else [
        r["id"] for r in state["roles"] if r["value"] == "SeBridge.Decide"][0]
elif args[:2] == ["cloud", "show"]:
    out = "https://graph.microsoft.com/"
elif args[:3] == ["ad", "sp", "list"]:
    out = state.get("sp_id", "")
elif args[:3] == ["ad", "sp", "create"]:
    state["sp_id"] = out = "5e2c1ce0-0000-4000-8000-000000000002"
elif args[:1] == ["rest"] and value("--method") == "GET":
    out = str(sum(1 for a in state.get("assigned", []) if a["principalId"] in value("--query")))
elif args[:1] == ["rest"] and value("--method") == "POST":
    state.setdefault("assigned", []).append(call["body"])
state_path.write_text(json.dumps(state))
if "-o" in args and value("-o") == "none":
    assert out == "", args  # a call whose answer the script needs must not be silenced
else:
    print(out)
"""


def _run_script(tmp_path: Path, *args: str) -> tuple[str, list[dict[str, Any]]]:
    fake = tmp_path / "az"
    fake.write_text(f"#!{sys.executable}\n{FAKE_AZ}", encoding="utf-8")
    fake.chmod(0o755)
    state = tmp_path / "state.json"
    if not state.exists():
        state.write_text("{}", encoding="utf-8")
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = os.environ | {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    command = ["bash", str(SCRIPT), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return done.stdout, calls


def _calls(calls: list[dict[str, Any]], *prefix: str) -> list[dict[str, Any]]:
    return [c for c in calls if c["args"][: len(prefix)] == list(prefix)]


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_script_creates_the_app_with_the_role_and_gives_it_to_the_people_named(
    tmp_path: Path,
) -> None:
    person, group = "0000aaaa-0000-4000-8000-000000000011", "0000bbbb-0000-4000-8000-000000000022"
    host = "sebridge-consumer-abc123.azurewebsites.net"
    out, calls = _run_script(tmp_path, "--host", host, "--assign", person, "--assign", group)
    app_id = "1d1e5e55-0000-4000-8000-00000000a99d"
    assert out.splitlines() == [f"peopleClientId={app_id}"]
    (create,) = _calls(calls, "ad", "app", "create")
    assert create["roles"] == json.loads((PEOPLE / "app-roles.json").read_text(encoding="utf-8"))
    assert "AzureADMyOrg" in create["args"]
    updates = _calls(calls, "ad", "app", "update")
    (uris,) = [c["args"] for c in updates if "--identifier-uris" in c["args"]]
    assert uris[uris.index("--identifier-uris") + 1] == f"api://{app_id}"
    assert uris[uris.index("--web-redirect-uris") + 1] == f"https://{host}/.auth/login/aad/callback"
    patches = [c["body"]["api"] for c in _calls(calls, "rest") if "PATCH" in c["args"]]
    assert [sorted(p) for p in patches] == [
        ["oauth2PermissionScopes", "requestedAccessTokenVersion"],
        ["preAuthorizedApplications"],
    ]
    (required,) = _calls(calls, "ad", "sp", "update")
    assert "appRoleAssignmentRequired=true" in required["args"]
    role_id = json.loads((PEOPLE / "app-roles.json").read_text(encoding="utf-8"))[0]["id"]
    posted = [c["body"] for c in _calls(calls, "rest") if "POST" in c["args"]]
    sp_id = "5e2c1ce0-0000-4000-8000-000000000002"
    assert posted == [
        {"principalId": who, "resourceId": sp_id, "appRoleId": role_id} for who in (person, group)
    ]


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_script_run_again_updates_the_app_and_assigns_no_one_twice(tmp_path: Path) -> None:
    person = "0000aaaa-0000-4000-8000-000000000011"
    _run_script(tmp_path, "--assign", person)
    out, calls = _run_script(tmp_path, "--assign", person)
    assert out.strip() == "peopleClientId=1d1e5e55-0000-4000-8000-00000000a99d"
    assert _calls(calls, "ad", "app", "create") == []
    assert _calls(calls, "ad", "sp", "create") == []
    assert [c for c in _calls(calls, "rest") if "POST" in c["args"]] == []
    (update,) = [c for c in _calls(calls, "ad", "app", "update") if c["roles"]]
    assert update["roles"][0]["value"] == ROLE
