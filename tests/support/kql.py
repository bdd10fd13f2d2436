"""One run of Microsoft's Kusto analyser for the whole test session.

Loading the parser in Node takes seconds, so every KQL text the tests need (what infra/
holds, plus probes that must fail) is analysed in a single call, cached for the session.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tools import kql_check
from tools.kql_check import KqlText, Result

# Files other helpers load by these exact names (the Bicep templates).
REQUIRED = (
    "infra/kql/dcr-transform.kql",
    "infra/kql/alerts/impactful-event-scheduled.kql",
    "infra/kql/alerts/approval-overdue.kql",
    "infra/kql/alerts/heartbeat-missing.kql",
    "infra/kql/alerts/spool-backlog-growing.kql",
    "infra/kql/alerts/preempt-spike.kql",
    "infra/kql/alerts/approval-failed.kql",
    "infra/kql/alerts/ask-pending.kql",
    "infra/kql/alerts/budget-override.kql",
    "infra/kql/alerts/drain-blocked.kql",
    "infra/kql/alerts/pause-long.kql",
    "infra/kql/alerts/upcoming-budget-break.kql",
    "infra/kql/queries/open-events.kql",
    "infra/kql/queries/maintenance-next-24h.kql",
    "infra/kql/queries/vm-history.kql",
    "infra/kql/queries/mean-time-to-approval.kql",
    "infra/workbook/se-bridge.workbook.json",
)

# The one parameter line Bicep replaces in each parameterised alert, and another value for it.
PARAMETERS = {
    "infra/kql/alerts/approval-overdue.kql": ("let MinutesBeforeNotBefore = 10m;", "25m"),
    "infra/kql/alerts/heartbeat-missing.kql": ("let MissingFor = 10m;", "1h"),
    "infra/kql/alerts/spool-backlog-growing.kql": ("let BacklogThreshold = 1000;", "50000"),
    "infra/kql/alerts/preempt-spike.kql": ("let PreemptThreshold = 5;", "20"),
    "infra/kql/alerts/ask-pending.kql": ("let AskPendingFor = 30m;", "2h"),
    "infra/kql/alerts/drain-blocked.kql": ("let BlockedFor = 15m;", "45m"),
    "infra/kql/alerts/pause-long.kql": ("let PausedFor = 8h;", "20h"),
    "infra/kql/alerts/upcoming-budget-break.kql": ("let AheadFor = 3d;", "14d"),
}

T = "SeBridgeRecords_CL"
# Queries the checker must refuse, each for one reason, with the line the error is on.
BAD = {
    "unknown-column": (f"{T}\n| where VmNmae == 'web_0'", 2),
    "datetime-vs-string": (f"{T}\n| where TimeGenerated > 'yesterday'", 2),
    "sum-of-string": (f"{T}\n| summarize sum(VmName)", 2),
    "syntax-error": (f"{T}\n| where RecordType ==\n| take 1", 2),
    "unknown-table": ("SeBridgeRecord_CL | take 1", 1),
    # Standard Log Analytics columns are left out on purpose: no query needs them.
    "standard-column": (f"{T} | where isnotempty(_ResourceId)", 1),
}
# DCR transformations: the first two run fine in Kusto but not in a DCR.
DCR_PROBES = {
    "summarize": "source | summarize count() by VmId",
    "join": "source | join kind=inner (source) on RecordId",
    "function": "source | extend Day = format_datetime(TimeGenerated, 'yyyy-MM-dd')",
    "scalar-operator": "source | where VmName has_any ('web_0', 'web_1')",
    "table": f"{T} | where RecordType == 'Event'",
    "allowed": (
        "let Tag = (t: string) { strcat('se-', t) };\n"
        "source\n| where isnotempty(RecordId) and RecordType in ('Event', 'Heartbeat')\n"
        "| extend Zone = iif(isempty(Zone), Tag('none'), Zone), Day = startofday(TimeGenerated)\n"
        "| project-away NotBeforeRaw, Day"
    ),
}
# A .bicep file with KQL written inline (found and checked) beside loaded KQL (skipped).
INLINE_BICEP = """\
var healthQuery = loadTextContent('kql/alerts/heartbeat-missing.kql')
resource rule 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  properties: {
    criteria: { allOf: [ { query: '{T} | where VmNmae == \\'x\\'', timeAggregation: 'Count' } ] }
  }
}
resource other 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  properties: { criteria: { allOf: [ { query: healthQuery } ] } }
}
""".replace("{T}", T)


@dataclass(frozen=True)
class Session:
    infra: list[KqlText]
    results: dict[str, Result]

    def result(self, name: str) -> Result:
        return self.results[name]


def probes() -> list[KqlText]:
    texts = [KqlText(f"bad:{name}", text) for name, (text, _) in BAD.items()]
    texts += [KqlText(f"dcr:{name}", text, "dcr") for name, text in DCR_PROBES.items()]
    for path, (line, value) in PARAMETERS.items():
        original = (kql_check.ROOT / path).read_text(encoding="utf-8")
        name = line.split()[1]
        texts.append(KqlText(f"param:{path}", original.replace(line, f"let {name} = {value};", 1)))
    return texts + _inline_bicep_texts()


def _inline_bicep_texts() -> list[KqlText]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "infra" / "modules").mkdir(parents=True)
        (root / "infra" / "modules" / "alerts.bicep").write_text(INLINE_BICEP, encoding="utf-8")
        return [KqlText(f"bicep:{t.name}", t.text, t.schema) for t in kql_check.collect(root)]


@cache
def session() -> Session:
    infra = kql_check.collect()
    texts = infra + probes()
    results = kql_check.run(texts)
    return Session(infra, {r.name: r for r in results})
