"""The sinks' settings are checked at start: each spec and each cloud sink's settings, with
errors that name the setting and never show a secret."""

from __future__ import annotations

import pytest

from bridge.agent.command import load_config
from bridge.config import ConfigError

CLOUD_ERRORS = {
    "bad sink": ({"SE_BRIDGE_AGENT_SINKS": "kafka:x"}, "agent.sinks: unknown sink 'kafka:x'"),
    "jsonl without a path": ({"SE_BRIDGE_AGENT_SINKS": "jsonl:"}, "needs a path"),
    "eventhubs without settings": (
        {"SE_BRIDGE_AGENT_SINKS": "eventhubs"},
        "the eventhubs sink needs eventhubs.namespace and eventhubs.name",
    ),
    "eventhubs namespace given as a URL": (
        {
            "SE_BRIDGE_AGENT_SINKS": "eventhubs",
            "SE_BRIDGE_EVENTHUBS_NAMESPACE": "sb://contoso.servicebus.windows.net/",
            "SE_BRIDGE_EVENTHUBS_NAME": "records",
        },
        "eventhubs.namespace: give the host name only",
    ),
    "loganalytics without settings": (
        {"SE_BRIDGE_AGENT_SINKS": "loganalytics"},
        "needs loganalytics.endpoint, loganalytics.rule_id",
    ),
    "loganalytics over http": (
        {
            "SE_BRIDGE_AGENT_SINKS": "loganalytics",
            "SE_BRIDGE_LOGANALYTICS_ENDPOINT": "http://x.ingest.monitor.azure.com",
            "SE_BRIDGE_LOGANALYTICS_RULE_ID": "dcr-1",
        },
        "loganalytics.endpoint must be an https:// URL",
    ),
}


@pytest.mark.parametrize(("env", "message"), CLOUD_ERRORS.values(), ids=CLOUD_ERRORS)
def test_cloud_sink_settings_are_checked_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ=env)
    assert message in str(info.value)


def test_a_secret_never_appears_in_an_error() -> None:
    secret = "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRET;EntityPath=h"
    with pytest.raises(ConfigError) as info:
        load_config(path=None, environ={}, flags={"eventhubs.connection_string": 42})
    assert "a secret value" in str(info.value)
    config = load_config(
        environ={
            "SE_BRIDGE_AGENT_SINKS": "eventhubs",
            "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": secret,
        }
    )
    assert config.eventhubs.connection_string == secret
    with pytest.raises(ConfigError) as bad:
        load_config(
            environ={
                "SE_BRIDGE_AGENT_SINKS": "eventhubs",
                "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": "TOPSECRET",
            }
        )
    assert "TOPSECRET" not in str(bad.value)
