// Log alert rules over SeBridgeRecords_CL, one per query in infra/kql/alerts/. A parameterised
// query has its one parameter on line 1 (`let Name = value;`), which is replaced here by the
// value of this module's parameter.

@description('Prefix of the rules\' names.')
param namePrefix string

param location string

@description('Resource id of the Log Analytics workspace holding SeBridgeRecords_CL.')
param workspaceId string

@description('Action group to notify (resource id); empty: the rules fire without notifying anyone.')
param actionGroupId string = ''

@description('Alert when an approval the policy expected is still missing this many minutes before NotBefore.')
@minValue(1)
@maxValue(60)
param approvalOverdueMinutes int = 10

@description('Alert when an agent\'s heartbeat has been missing this many minutes (heartbeats come every 5 minutes).')
@minValue(6)
@maxValue(720)
param heartbeatMissingMinutes int = 10

@description('Alert when an agent\'s spool holds at least this many records and grows.')
@minValue(1)
param spoolBacklogThreshold int = 1000

@description('Alert when at least this many Preempt events appear in one region within an hour.')
@minValue(1)
param preemptThreshold int = 5

@description('Alert when a person asked about an event (the policy\'s ask action) has not answered for this many minutes.')
@minValue(5)
@maxValue(720)
param askPendingMinutes int = 30

@description('Alert when a Kubernetes node\'s drain has been blocked (a PodDisruptionBudget, a pod waited for) for this many minutes.')
@minValue(2)
@maxValue(720)
param drainBlockedMinutes int = 15

@description('Alert when early approvals have been paused (fleet-wide or in a budget group) for this many hours.')
@minValue(1)
@maxValue(24)
param pauseActiveHours int = 8

@description('The week ahead is on (the consumer writes Upcoming records, weekahead settings; docs/planned-disruptions.md): enables the upcoming-budget-break rule. Off: the rule is deployed disabled.')
param weekAhead bool = false

@description('With weekAhead: alert when a disruption the week ahead foresees within this many days would break a budget.')
@minValue(1)
@maxValue(14)
param upcomingBudgetBreakDays int = 3

param tags object = {}

var actions = empty(actionGroupId) ? [] : [
  actionGroupId
]

// Drop line 1 (the default `let Name = value;`) and put this deployment's value in its place.
var overdueText = loadTextContent('../kql/alerts/approval-overdue.kql')
var overdueQuery = 'let MinutesBeforeNotBefore = ${approvalOverdueMinutes}m;\n${join(skip(split(overdueText, '\n'), 1), '\n')}'
var heartbeatText = loadTextContent('../kql/alerts/heartbeat-missing.kql')
var heartbeatQuery = 'let MissingFor = ${heartbeatMissingMinutes}m;\n${join(skip(split(heartbeatText, '\n'), 1), '\n')}'
var spoolText = loadTextContent('../kql/alerts/spool-backlog-growing.kql')
var spoolQuery = 'let BacklogThreshold = ${spoolBacklogThreshold};\n${join(skip(split(spoolText, '\n'), 1), '\n')}'
var preemptText = loadTextContent('../kql/alerts/preempt-spike.kql')
var preemptQuery = 'let PreemptThreshold = ${preemptThreshold};\n${join(skip(split(preemptText, '\n'), 1), '\n')}'
var askText = loadTextContent('../kql/alerts/ask-pending.kql')
var askQuery = 'let AskPendingFor = ${askPendingMinutes}m;\n${join(skip(split(askText, '\n'), 1), '\n')}'
var drainText = loadTextContent('../kql/alerts/drain-blocked.kql')
var drainQuery = 'let BlockedFor = ${drainBlockedMinutes}m;\n${join(skip(split(drainText, '\n'), 1), '\n')}'
var pauseText = loadTextContent('../kql/alerts/pause-long.kql')
var pauseQuery = 'let PausedFor = ${pauseActiveHours}h;\n${join(skip(split(pauseText, '\n'), 1), '\n')}'
var upcomingText = loadTextContent('../kql/alerts/upcoming-budget-break.kql')
var upcomingQuery = 'let AheadFor = ${upcomingBudgetBreakDays}d;\n${join(skip(split(upcomingText, '\n'), 1), '\n')}'

// windowSize bounds TimeGenerated for the query. Event-like rules look back an hour, so that
// records ingested late are still seen, and keep only what was first ingested in the last
// evaluation period (ingestion_time() in each query; no repeats); state-like rules look back a
// day to find the event's Scheduled record or an agent's last heartbeat.
var rules = [
  {
    name: 'impactful-event-scheduled'
    title: 'se-bridge: impactful maintenance scheduled'
    description: 'A Reboot, Redeploy, Preempt or Terminate event was scheduled for a VM.'
    severity: 2
    frequency: 'PT5M'
    window: 'PT1H'
    query: loadTextContent('../kql/alerts/impactful-event-scheduled.kql')
    enabled: true
  }
  {
    name: 'approval-overdue'
    title: 'se-bridge: expected approval overdue'
    description: 'The policy decided to approve an event, but no approval arrived ${approvalOverdueMinutes} minutes before NotBefore.'
    severity: 2
    frequency: 'PT5M'
    window: 'P1D'
    query: overdueQuery
    enabled: true
  }
  {
    name: 'heartbeat-missing'
    title: 'se-bridge: agent heartbeat missing'
    description: 'An agent has sent no heartbeat for ${heartbeatMissingMinutes} minutes without stopping cleanly.'
    severity: 1
    frequency: 'PT5M'
    window: 'P1D'
    query: heartbeatQuery
    enabled: true
  }
  {
    name: 'spool-backlog-growing'
    title: 'se-bridge: agent spool backlog growing'
    description: 'An agent\'s spool holds ${spoolBacklogThreshold} or more undelivered records and grows, or it shed records.'
    severity: 2
    frequency: 'PT15M'
    window: 'PT1H'
    query: spoolQuery
    enabled: true
  }
  {
    name: 'preempt-spike'
    title: 'se-bridge: spike of Spot evictions'
    description: '${preemptThreshold} or more Preempt events in one region within an hour.'
    severity: 2
    frequency: 'PT15M'
    window: 'PT1H'
    query: preemptQuery
    enabled: true
  }
  {
    name: 'approval-failed'
    title: 'se-bridge: approval failed'
    description: 'IMDS rejected an approval an agent sent (ApprovalOutcome Failed).'
    severity: 1
    frequency: 'PT5M'
    window: 'PT1H'
    query: loadTextContent('../kql/alerts/approval-failed.kql')
    enabled: true
  }
  {
    name: 'ask-pending'
    title: 'se-bridge: a person asked has not answered'
    description: 'The policy asked a person about an event ${askPendingMinutes} minutes ago and nobody has approved or held it; the event is still ahead.'
    severity: 2
    frequency: 'PT5M'
    window: 'P1D'
    query: askQuery
    enabled: true
  }
  {
    name: 'budget-override'
    title: 'se-bridge: approval over a full budget'
    description: 'A person approved an event over a full budget (break-glass, with their reason).'
    severity: 1
    frequency: 'PT5M'
    window: 'PT1H'
    query: loadTextContent('../kql/alerts/budget-override.kql')
    enabled: true
  }
  {
    name: 'drain-blocked'
    title: 'se-bridge: Kubernetes node drain blocked'
    description: 'A node\'s drain has been blocked for ${drainBlockedMinutes} minutes (an eviction refused by a PodDisruptionBudget, or a pod waited for); the blockers are in the result.'
    severity: 2
    frequency: 'PT5M'
    window: 'P1D'
    query: drainQuery
    enabled: true
  }
  {
    // Two days, the longest window a log alert takes: a pause older than that drops out.
    name: 'pause-long'
    title: 'se-bridge: approvals paused for long'
    description: 'Early approvals have been paused for ${pauseActiveHours} hours or more (fleet-wide or in a budget group).'
    severity: 3
    frequency: 'PT15M'
    window: 'P2D'
    query: pauseQuery
    enabled: true
  }
  {
    // Days ahead: hourly is soon enough, and the latest pass is within a day.
    name: 'upcoming-budget-break'
    title: 'se-bridge: a disruption ahead would break a budget'
    description: 'A maintenance configuration\'s run, a Service Health planned maintenance or an AKS upgrade within ${upcomingBudgetBreakDays} days would take more of a budget group at once than the policy allows.'
    severity: 3
    frequency: 'PT1H'
    window: 'P1D'
    query: upcomingQuery
    enabled: weekAhead
  }
]

resource alert 'Microsoft.Insights/scheduledQueryRules@2026-03-01' = [for rule in rules: {
  name: '${namePrefix}-${rule.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: rule.title
    description: rule.description
    severity: rule.severity
    enabled: rule.enabled
    scopes: [
      workspaceId
    ]
    evaluationFrequency: rule.frequency
    windowSize: rule.window
    criteria: {
      allOf: [
        {
          query: rule.query
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: actions
    }
  }
}]

output ruleNames array = [for (rule, i) in rules: alert[i].name]
