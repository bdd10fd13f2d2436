"""infra/'s patch runs (issue 40, item 1): the maintenance configurations' system topics and
the cancel role, declared only behind main.bicep's parameters, off by default, the role no
wider than reading the configurations and writing their applyUpdates."""

from __future__ import annotations

import re

from tests.infra.test_bicep import MAIN, MODULES
from tests.support import bicep

TOPICS = MODULES / "patch-runs.bicep"
CANCEL = MODULES / "patch-run-cancel.bicep"


def test_patch_runs_and_their_cancel_are_off_by_default_and_only_behind_their_parameters() -> None:
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param patchRuns bool = false$", main, re.MULTILINE)
    assert re.search(r"^param patchRunCancel bool = false$", main, re.MULTILINE)
    assert re.search(r"^param patchRunOnBreach string = 'run'$", main, re.MULTILINE)
    assert "= if (eventGridSource && patchRuns) {" in main
    assert "= if (eventGridSource && patchRuns && patchRunCancel) {" in main


def test_the_topics_are_maintenance_configurations_delivering_only_the_two_event_types() -> None:
    text = TOPICS.read_text(encoding="utf-8")
    assert "topicType: 'Microsoft.Maintenance.MaintenanceConfigurations'" in text
    assert "'Microsoft.Maintenance.PreMaintenanceEvent'" in text
    assert "'Microsoft.Maintenance.PostMaintenanceEvent'" in text
    found = bicep.resources(TOPICS, "Microsoft.EventGrid/systemTopics/eventSubscriptions")
    properties = bicep.unlooped(found["subscriptions"]["config"])["properties"]
    assert properties["deliveryWithResourceIdentity"]["destination"]["endpointType"] == "EventHub"
    assert "destination" not in properties  # never a SAS-keyed destination


def test_the_cancel_role_reads_configurations_and_writes_their_apply_updates_only() -> None:
    text = CANCEL.read_text(encoding="utf-8")
    actions = re.findall(r"^  '(Microsoft\.[^']+)'$", text, re.MULTILINE)
    assert actions == [
        "Microsoft.Maintenance/maintenanceConfigurations/read",
        "Microsoft.Maintenance/applyUpdates/read",
        "Microsoft.Maintenance/applyUpdates/write",
    ]
    assert "resourceGroup().id\n    ]" in text  # assignable in the configurations' group only
    assert "dataActions: []" in text
    assert "*" not in "".join(actions)
