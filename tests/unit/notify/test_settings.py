"""[notify]: targets as tables (or JSON in the environment), refused naming the setting and
never quoting a URL. A target's URL read from Key Vault: tests/component/notify/test_settings.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bridge import config
from bridge.config import ConfigError, NotifyTarget, load
from bridge.notify import kinds

SECRET_URL = "https://prod-01.westeurope.logic.azure.com/workflows/1/invoke?sig=c2VjcmV0LXNpZw"
VAULT = "https://contoso.vault.azure.net"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_targets_are_tables_in_the_file_and_json_in_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
[notify]
page_url = "https://bridge.contoso.com/"
key_vault = "{VAULT}"

[[notify.targets]]
name = "dba"
kind = "Teams"
url = "{SECRET_URL}"

[[notify.targets]]
name = "ops"
kind = "slack"
url_secret = "ops-webhook"
""")  # fmt: skip
    settings = load(path, environ={}).notify
    assert settings.targets == [NotifyTarget("dba", "teams", SECRET_URL, ""),
                                NotifyTarget("ops", "slack", "", "ops-webhook")]  # fmt: skip
    env = json.dumps([{"name": "any", "kind": "generic", "url": SECRET_URL}])
    from_env = load(environ={"SE_BRIDGE_NOTIFY_TARGETS": env}).notify.targets
    assert from_env == [NotifyTarget("any", "generic", SECRET_URL, "")]
    assert load(environ={"SE_BRIDGE_NOTIFY_TARGETS": ""}).notify.targets == []


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ([{"name": "a", "kind": "email", "url": SECRET_URL}], "target a: kind must be one of"),
        ([{"name": "a", "kind": "teams"}], "target a: give url or url_secret"),
        ([{"name": "a", "kind": "teams", "url": SECRET_URL, "url_secret": "s"}], "one of them"),
        ([{"name": "a", "kind": "teams", "url": "ftp://x" + SECRET_URL}], "http(s) address"),
        ([{"name": "a b", "kind": "teams", "url": SECRET_URL}], "target 1 needs a name"),
        ([{"name": "a", "kind": "teams", "url": SECRET_URL, "uri": SECRET_URL}], "not uri"),
        ([{"name": "a", "kind": "teams", "url": 5}], "keys are strings"),
        ([{"name": "a", "kind": "teams", "url": SECRET_URL}] * 2, "two targets are named a"),
        ({"name": "a"}, "expected a list of tables"),
        ("{not json " + SECRET_URL, "expected a JSON list of tables"),
    ],
)
def test_a_bad_target_names_the_setting_and_never_quotes_a_url(targets: Any, message: str) -> None:
    raw = targets if isinstance(targets, str) else json.dumps(targets)
    with pytest.raises(ConfigError, match=r"notify\.targets") as caught:
        load(environ={"SE_BRIDGE_NOTIFY_TARGETS": raw})
    assert message in str(caught.value)
    assert "sig=" not in str(caught.value)
    assert "logic.azure.com" not in str(caught.value)


def test_a_url_is_in_no_repr_of_the_settings() -> None:
    env = {"SE_BRIDGE_NOTIFY_TARGETS": json.dumps([{"name": "a", "kind": "slack",
                                                     "url": SECRET_URL}])}  # fmt: skip
    assert "sig=" not in repr(load(environ=env))


def test_the_settings_and_the_kinds_name_the_same_formats() -> None:
    assert tuple(kind.name for kind in kinds.KINDS) == config.NOTIFY_KINDS


def test_a_url_secret_needs_the_key_vault() -> None:
    env = {"SE_BRIDGE_NOTIFY_TARGETS": '[{"name": "ops", "kind": "slack", "url_secret": "w"}]'}
    with pytest.raises(ConfigError, match=r"notify\.key_vault: targets ops"):
        kinds.check_config(load(environ=env))


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize(
    ("key", "value", "warned"), [("url", SECRET_URL, True), ("url_secret", "ops-webhook", False)]
)
def test_a_readable_config_file_is_a_warning_only_when_it_holds_a_url(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str, value: str, warned: bool
) -> None:
    path = write(tmp_path, f'[[notify.targets]]\nname = "a"\nkind = "teams"\n{key} = "{value}"\n')
    path.chmod(0o644)
    config.warn_if_secrets_readable(path)
    assert ("holds notify.targets and every user" in caplog.text) is warned


@pytest.mark.parametrize(
    "page_url", ["https://bridge.contoso.com/approvals", "http://[::1]:8787/x/"]
)
def test_a_page_url_under_a_path_is_refused(page_url: str) -> None:
    """The page's links and forms are from its root (`/events/...`, `/decide`): under a path
    they would lead off the page."""
    env = {"SE_BRIDGE_NOTIFY_PAGE_URL": page_url}
    with pytest.raises(ConfigError, match=r"notify\.page_url: .* at the root of its host"):
        kinds.check_config(load(environ=env))


@pytest.mark.parametrize(
    "page_url",
    [
        "https://[abc/",
        "https://h:port/",
        "https://user:pw@h/",
        "ftp://h/",
        "https://",
    ],
)
def test_a_page_url_that_is_no_plain_address_is_refused_with_the_setting_named(
    page_url: str,
) -> None:
    with pytest.raises(ConfigError, match=r"notify\.page_url: "):
        kinds.check_config(load(environ={"SE_BRIDGE_NOTIFY_PAGE_URL": page_url}))


@pytest.mark.parametrize("page_url", ["https://h/?", "https://h/#", "https://h/?x=1"])
def test_a_page_url_with_a_query_is_refused(page_url: str) -> None:
    with pytest.raises(ConfigError, match=r"without a path"):
        kinds.check_config(load(environ={"SE_BRIDGE_NOTIFY_PAGE_URL": page_url}))


@pytest.mark.parametrize(
    "page_url",
    ["https://app.azurewebsites.net/", "https://app.azurewebsites.net", "http://127.0.0.1:8787/"],
)
def test_a_page_url_at_its_hosts_root_is_taken(page_url: str) -> None:
    kinds.check_config(load(environ={"SE_BRIDGE_NOTIFY_PAGE_URL": page_url}))
