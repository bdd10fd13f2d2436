"""What the cloud end-to-end tests share: the two doubles and the agent's settings for them."""

from __future__ import annotations

from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble

RULE = "dcr-00000000000000000000000000000002"


def cloud_env(broker: EventHubsBroker, logs: LogsIngestionDouble, imds_url: str) -> dict[str, str]:
    """Settings of an agent shipping to both doubles, with a managed identity from `imds_url`."""
    return {
        "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": broker.connection_string,
        "SE_BRIDGE_LOGANALYTICS_ENDPOINT": logs.endpoint,
        "SE_BRIDGE_LOGANALYTICS_RULE_ID": RULE,
        # Heartbeats and neighbours' events wait for the next upload this long (60 s by
        # default): held and sent alike here, without a minute's wait per check.
        "SE_BRIDGE_LOGANALYTICS_SEND_INTERVAL": "5",
        "SE_BRIDGE_IDENTITY_KIND": "managed",
        # The real credential code fetches its token from the simulator's identity endpoint.
        "AZURE_POD_IDENTITY_AUTHORITY_HOST": imds_url,
        "REQUESTS_CA_BUNDLE": str(logs.ca_bundle),
        "CURL_CA_BUNDLE": str(logs.ca_bundle),
        "NO_PROXY": "127.0.0.1,localhost",
    }
