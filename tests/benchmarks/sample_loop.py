"""The Python sample of the seed documents (Microsoft's Scheduled Events page), the baseline of
the footprint benchmark. Run as a script: `python sample_loop.py`.

Copied from /work/shared/seeds/000_75cb5ef541c618f1.txt ("Python 샘플", lines 287-357) with
its indentation restored. Two changes, both marked: `metadata_url` takes its base from
SAMPLE_IMDS_BASE so it can point at the simulator, and `main` calls `advanced_sample` in a
loop instead of waiting for "1" on stdin (the benchmark has no keyboard). Everything else,
`requests.get` per poll without a session included, is as published.
"""
# ruff: noqa: RET504, PLR1711, SIM114

# !/usr/bin/python
import json
import os
from time import sleep
from typing import Any

import requests

# The URL to access the metadata service
# CHANGED: the base comes from the environment (default: the real IMDS address).
metadata_url = (
    os.environ.get("SAMPLE_IMDS_BASE", "http://169.254.169.254") + "/metadata/scheduledevents"
)
# This must be sent otherwise the request will be ignored
header = {"Metadata": "true"}
# Current version of the API
query_params = {"api-version": "2020-07-01"}


def get_scheduled_events() -> Any:
    resp = requests.get(metadata_url, headers=header, params=query_params)
    data = resp.json()
    return data


def confirm_scheduled_event(event_id: str) -> int:
    # This payload confirms a single event with id event_id
    # You can confirm multiple events in a single request if needed
    payload = json.dumps({"StartRequests": [{"EventId": event_id}]})
    response = requests.post(metadata_url, headers=header, params=query_params, data=payload)
    return response.status_code


def log(event: Any) -> None:
    # This is an optional placeholder for logging events to your system
    print(event["Description"])
    return


def advanced_sample(last_document_incarnation: Any) -> Any:
    # Poll every second to see if there are new scheduled events to process
    # Since some events may have necessarily short warning periods, it is
    # recommended to poll frequently
    found_document_incarnation = last_document_incarnation
    while last_document_incarnation == found_document_incarnation:
        sleep(1)
        payload = get_scheduled_events()
        found_document_incarnation = payload["DocumentIncarnation"]
        # We recommend processing all events in a document together,
        # even if you won't be actioning on them right away
        for event in payload["Events"]:
            # Events that have already started, logged for tracking
            if event["EventStatus"] == "Started":
                log(event)
            # Approve all user initiated events. These are typically created by an
            # administrator and approving them immediately can help to avoid delays
            # in admin actions
            elif event["EventSource"] == "User":
                confirm_scheduled_event(event["EventId"])
            # For this application, freeze events less that 9 seconds are considered
            # no impact. This will immediately approve them
            elif (
                event["EventType"] == "Freeze"
                and int(event["DurationInSeconds"]) >= 0
                and int(event["DurationInSeconds"]) < 9
            ):
                confirm_scheduled_event(event["EventId"])
            # Events that may be impactful (for example reboot or redeploy) may need custom
            # handling for your application
            else:
                # TODO Custom handling for impactful events
                log(event)
    print("Processed events from document: " + str(found_document_incarnation))
    return found_document_incarnation


def main() -> None:
    # This will track the last set of events seen
    last_document_incarnation = "-1"
    # CHANGED: the published main asks "Press 1 to poll for new events" before each call.
    while True:
        last_document_incarnation = advanced_sample(last_document_incarnation)


if __name__ == "__main__":
    main()
