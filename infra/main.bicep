// se-bridge's Azure side: Event Hubs, the Log Analytics table and data collection rule, the
// storage account for queues, tables and checkpoints, the consumer's Function App and Key Vault,
// least-privilege role assignments, alert rules and a workbook. A large fleet shards: several
// Event Hubs namespaces (each read by a Function App of its own), data collection rules and
// queue storage accounts, a VM using the one at index (first 8 hex digits of its VmId) modulo
// their number (docs/deploying.md). Deploy into a resource group:
//   az deployment group create -g RG -f infra/main.bicep -p signingKeyPem=@signing-key.pem
// then onboard each VM with infra/onboarding/vm.bicep and an install script (docs/deploying.md).

@description('Region of every resource but the workspace (and the ingestion endpoint and rule, which follow the workspace).')
param location string = resourceGroup().location

@description('Short prefix of resource names (lowercase letters and digits).')
@minLength(2)
@maxLength(10)
param prefix string = 'sebridge'

@description('Suffix that makes globally unique names unique; derived from the resource group by default.')
@minLength(4)
@maxLength(13)
param suffix string = take(uniqueString(resourceGroup().id), 6)

@description('Event hub the agents send records to.')
param eventHubName string = 'records'

@description('Partitions of the event hub: the consumer scales out to at most one instance per partition. Fixed after creation.')
@minValue(1)
@maxValue(32)
param eventHubPartitionCount int = 4

@description('Identical data collection rules the agents are spread over: one rule takes 12,000 requests a minute, about 50,000 VMs at the default 5-minute heartbeat (docs/capacity.md#azure-quotas).')
@minValue(1)
@maxValue(20)
param ingestionRuleCount int = 1

@description('Event Hubs namespaces the agents are spread over, each read by a Function App of its own (all sharing the fleet table, the signing key and the workspace): agents over AMQP count against the 5,000 concurrent connections of a Standard namespace, agents over HTTPS (the default) against nothing but its ingress (docs/capacity.md#azure-quotas). Namespace 0 is <prefix>-<suffix>, the others add -1, -2, ...')
@minValue(1)
@maxValue(20)
param eventHubNamespaceCount int = 1

@description('Storage accounts holding the per-VM command queues: one account takes 20,000 requests a second (docs/capacity.md#azure-quotas). Account 0 is storageAccountName; the others hold queues only.')
@minValue(1)
@maxValue(20)
param queueAccountCount int = 1

@description('Consumer group of the Function App (not shared with a standalone consumer).')
param consumerGroupName string = 'se-bridge-functions'

@description('Create a new Log Analytics workspace (true) or use an existing one (false).')
param createWorkspace bool = true

@description('Name of the workspace (new or existing).')
param workspaceName string = '${prefix}-logs-${suffix}'

@description('Resource group of the workspace; an existing one may live elsewhere in this subscription.')
param workspaceResourceGroup string = resourceGroup().name

@description('Region of the workspace (for a new one), the data collection endpoint and rule: set it to an existing workspace\'s region.')
param workspaceLocation string = location

@description('Days records stay in SeBridgeRecords_CL.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 90

@description('Storage account for queues, the fleet table, checkpoints and the Function App.')
@minLength(3)
@maxLength(24)
param storageAccountName string = take('${prefix}${suffix}', 24)

@description('Per-VM queue name prefix (commands.queue_prefix); the queue is this plus the VmId in lowercase.')
param queuePrefix string = 'se-bridge-'

@description('Table Storage table of the fleet state (consumer.table_name).')
param fleetTableName string = 'sebridgefleet'

@description('Blob container of a standalone consumer\'s checkpoints (consumer.checkpoint_container).')
param checkpointContainerName string = 'se-bridge-checkpoints'

@description('Function App name (globally unique); the apps of namespaces 1, 2, ... add -1, -2, ... Apps sharing host storage need different first 32 characters: keep it to 29 with several namespaces.')
param functionAppName string = '${prefix}-consumer-${suffix}'

@description('Optional approval policy file deployed with the Function App (SE_BRIDGE_CONSUMER_POLICY), such as policy.yaml.')
param consumerPolicy string = ''

@description('True: the consumer may create a VM\'s queue with its first command (Storage Queue Data Contributor). False: Message Sender only, and every VM must be onboarded with infra/onboarding/vm.bicep.')
param consumerCreatesQueues bool = true

@description('Key Vault for the command-signing key (globally unique, 3-24 characters).')
@minLength(3)
@maxLength(24)
param keyVaultName string = take('${prefix}-kv-${suffix}', 24)

@description('Public network access of the Key Vault. Disabled needs a private endpoint and VNet integration that this template does not declare.')
@allowed([
  'Enabled'
  'Disabled'
])
param keyVaultPublicNetworkAccess string = 'Enabled'

@description('Name of the Key Vault secret holding the signing key.')
param signingKeySecretName string = 'se-bridge-signing-key'

@description('The consumer\'s Ed25519 private key, PEM, as `se-bridge keygen` writes it (pass with -p signingKeyPem=@FILE).')
@secure()
param signingKeyPem string

@description('Client id of the Entra ID app registration people sign in to for the approval page and API, with the SeBridge.Decide app role (infra/people/decide-app.sh creates it). Empty: no page, no App Service Authentication.')
param peopleClientId string = ''

@description('Entra ID tenant (directory) id whose people may sign in.')
param peopleTenantId string = tenant().tenantId

@description('URL of the webhook the consumer notifies people through (a Microsoft Teams workflow, Slack, or a generic receiver): stored in the Key Vault, never output. Empty: no notifications.')
@secure()
param notifyWebhookUrl string = ''

@description('Name of that notification target, as a policy\'s ask.target names it.')
param notifyTargetName string = 'people'

@description('What the webhook takes: generic, teams or slack.')
@allowed([
  'generic'
  'teams'
  'slack'
])
param notifyTargetKind string = 'generic'

@description('Name of the Key Vault secret holding the webhook URL.')
param notifyWebhookSecretName string = 'se-bridge-notify-webhook'

@description('Deploy the alert rules.')
param deployAlerts bool = true

@description('Send the logs and metrics of Event Hubs, Storage, Key Vault and the Function App to the workspace (diagnostic settings; billed as workspace ingestion).')
param deployDiagnostics bool = true

@description('Action group the alert rules notify (resource id); empty: none.')
param actionGroupId string = ''

@description('Alert when an expected approval is still missing this many minutes before NotBefore.')
param approvalOverdueMinutes int = 10

@description('Alert when an agent\'s heartbeat has been missing this many minutes.')
param heartbeatMissingMinutes int = 10

@description('Alert when an agent\'s spool holds at least this many records and grows.')
param spoolBacklogThreshold int = 1000

@description('Alert when at least this many Preempt events appear in one region within an hour.')
param preemptThreshold int = 5

@description('Alert when a person asked about an event (the policy\'s ask action) has not answered for this many minutes.')
param askPendingMinutes int = 30

@description('Alert when a Kubernetes node\'s drain has been blocked for this many minutes.')
param drainBlockedMinutes int = 15

@description('Alert when early approvals have been paused for this many hours.')
param pauseActiveHours int = 8

@description('The first Function App reads the week ahead (weekahead.enabled; docs/planned-disruptions.md#the-week-ahead): every weekAheadInterval, the maintenance configurations of this subscription, their assignments and the VMs they patch, through Resource Graph, written as Upcoming records naming the budgets each run would break: Reader on each of weekAheadResourceGroups.')
param weekAhead bool = false

@description('With weekAhead: alert when a disruption within this many days would break a budget (1-14).')
@minValue(1)
@maxValue(14)
param upcomingBudgetBreakDays int = 3

@description('Deploy the workbook.')
param deployWorkbook bool = true

@description('Azure\'s own view as a second source (preview, off by default; docs/second-source.md): the scheduled-events system topic of this subscription delivering to an event hub `eventgrid` the consumer reads (eventgrid.enabled).')
param eventGridSource bool = false

// The hub the system topics deliver to: named here, not read from the module's output, since the
// first Function App's settings name it and the module needs that app's identity.
var eventGridHubName = 'eventgrid'

@description('With eventGridSource: also the resource-health system topic (eventgrid.health).')
param eventGridHealth bool = false

@description('With eventGridSource: the consumer may approve, through ARM\'s acknowledge (preview), an event no live agent can carry (eventgrid.acknowledge): Scheduled Events Contributor on each of eventGridFleetResourceGroups.')
param eventGridAcknowledge bool = false

@description('With eventGridSource: the first Function App runs the Resource Graph reconciler (preview; eventgrid.reconcile_interval), which catches what a lost Event Grid delivery missed: Reader on each of eventGridFleetResourceGroups.')
param eventGridReconcile bool = false

// The intervals the Functions app's timer keeps evenly (bridge/consumer/functionapp.py's
// RECONCILE_INTERVALS): minutes that divide an hour, hours that divide a day.
@description('With eventGridReconcile: seconds between two passes of the reconciler.')
@allowed([60, 120, 180, 240, 300, 360, 600, 720, 900, 1200, 1800, 3600, 7200, 10800, 14400, 21600, 28800, 43200, 86400])
param eventGridReconcileInterval int = 300

@description('With eventGridAcknowledge or eventGridReconcile: the resource groups of the fleet\'s VMs, scale sets and availability sets, in this subscription. Empty: this deployment\'s resource group.')
param eventGridFleetResourceGroups array = []

@description('With eventGridSource: count Update Manager\'s patch runs in the budgets (preview events; patchruns.enabled; docs/planned-disruptions.md): the system topics of patchRunConfigurations deliver their pre- and post-maintenance events to the second source\'s hub; Reader on patchRunConfigurationsResourceGroup (and on eventGridFleetResourceGroups) lets the consumer read each run\'s VMs through Resource Graph.')
param patchRuns bool = false

@description('With patchRuns: the maintenance configurations\' resource ids, all in patchRunConfigurationsResourceGroup of this subscription.')
param patchRunConfigurations array = []

@description('With patchRuns: the resource group of patchRunConfigurations.')
param patchRunConfigurationsResourceGroup string = ''

@description('With patchRuns: the configurations\' region (their system topics must be in it).')
param patchRunConfigurationsLocation string = ''

@description('With patchRuns: what a run over a budget gets (patchruns.on_breach): run, ask, or cancel (needs patchRunCancel).')
@allowed(['run', 'ask', 'cancel'])
param patchRunOnBreach string = 'run'

@description('With patchRuns: the consumer may cancel a run through applyUpdates before its cut-off (patchruns.cancel; preview API): a custom role with applyUpdates/write on patchRunConfigurationsResourceGroup only.')
param patchRunCancel bool = false

// The intervals the Functions app's timer keeps evenly (functionapp.RECONCILE_INTERVALS) that
// weekahead.interval takes (15 minutes or more).
@description('With weekAhead: seconds between two reads.')
@allowed([900, 1200, 1800, 3600, 7200, 10800, 14400, 21600, 28800, 43200, 86400])
param weekAheadInterval int = 21600

@description('With weekAhead: the resource groups, in this subscription, of the maintenance configurations, their assignments and the fleet\'s VMs and scale sets, where Reader is granted. Empty: this deployment\'s resource group. Dynamic scopes, Service Health and AKS notices live at the subscription: see weekAheadSubscriptionReader.')
param weekAheadResourceGroups array = []

@description('With weekAhead: grant the consumer\'s identity Reader on this subscription, which Service Health\'s planned maintenance, AKS\'s upgrade notices and maintenance configurations\' dynamic scopes need (Resource Graph answers their rows only to a reader of the subscription). The deployer must be allowed to assign roles at the subscription (Owner or User Access Administrator there).')
param weekAheadSubscriptionReader bool = false

param tags object = {
  application: 'se-bridge'
}

var deploymentContainerName = 'app-package'
var diagnosticsWorkspaceId = deployDiagnostics ? workspace.outputs.workspaceId : ''
// Account 0 is the main storage account; the others are queue-only (modules/queues.bicep).
var queueAccountNames = [for i in range(0, queueAccountCount): (i == 0) ? storageAccountName : take('${prefix}q${i}${suffix}', 24)]

module eventHubs 'modules/eventhubs.bicep' = [for i in range(0, eventHubNamespaceCount): {
  name: (i == 0) ? 'se-bridge-eventhubs' : 'se-bridge-eventhubs-${i}'
  params: {
    namespaceName: (i == 0) ? '${prefix}-${suffix}' : '${prefix}-${suffix}-${i}'
    location: location
    eventHubName: eventHubName
    partitionCount: eventHubPartitionCount
    consumerGroupName: consumerGroupName
    tags: tags
    diagnosticsWorkspaceId: diagnosticsWorkspaceId
  }
}]

module workspace 'modules/workspace.bicep' = {
  name: 'se-bridge-workspace'
  scope: resourceGroup(workspaceResourceGroup)
  params: {
    workspaceName: workspaceName
    createWorkspace: createWorkspace
    location: workspaceLocation
    retentionInDays: retentionInDays
    tags: tags
  }
}

module ingestion 'modules/ingestion.bicep' = {
  name: 'se-bridge-ingestion'
  params: {
    endpointName: '${prefix}-dce-${suffix}'
    ruleName: '${prefix}-dcr-${suffix}'
    location: workspaceLocation
    workspaceId: workspace.outputs.workspaceId
    ruleCount: ingestionRuleCount
    tags: tags
  }
  dependsOn: [
    // The rule's output stream must exist in the workspace before the rule is created.
    workspace
  ]
}

module storage 'modules/storage.bicep' = {
  name: 'se-bridge-storage'
  params: {
    accountName: storageAccountName
    location: location
    fleetTableName: fleetTableName
    checkpointContainerName: checkpointContainerName
    deploymentContainerName: deploymentContainerName
    deploymentContainerCount: eventHubNamespaceCount
    tags: tags
    diagnosticsWorkspaceId: diagnosticsWorkspaceId
  }
}

module queueStorage 'modules/queues.bicep' = [for i in range(1, queueAccountCount - 1): {
  name: 'se-bridge-queues-${i}'
  params: {
    accountName: queueAccountNames[i]
    location: location
    tags: tags
    diagnosticsWorkspaceId: diagnosticsWorkspaceId
  }
}]

module keyVault 'modules/keyvault.bicep' = {
  name: 'se-bridge-keyvault'
  params: {
    vaultName: keyVaultName
    location: location
    publicNetworkAccess: keyVaultPublicNetworkAccess
    secretName: signingKeySecretName
    signingKeyPem: signingKeyPem
    webhookSecretName: notifyWebhookSecretName
    webhookUrl: notifyWebhookUrl
    tags: tags
    diagnosticsWorkspaceId: diagnosticsWorkspaceId
  }
}

// One consumer per namespace, each reading its own namespace with its own consumer group.
module functionApp 'modules/functionapp.bicep' = [for i in range(0, eventHubNamespaceCount): {
  name: (i == 0) ? 'se-bridge-functionapp' : 'se-bridge-functionapp-${i}'
  params: {
    appName: (i == 0) ? functionAppName : '${functionAppName}-${i}'
    location: location
    storageAccountName: storage.outputs.accountName
    blobEndpoint: storage.outputs.blobEndpoint
    deploymentContainerName: storage.outputs.deploymentContainerNames[i]
    eventHubsNamespaceFqdn: eventHubs[i].outputs.namespaceFqdn
    eventHubName: eventHubs[i].outputs.eventHubName
    consumerGroupName: eventHubs[i].outputs.consumerGroupName
    logsIngestionEndpoint: ingestion.outputs.logsIngestionEndpoint
    dataCollectionRuleImmutableId: ingestion.outputs.ruleImmutableId
    signingKeySecretUri: keyVault.outputs.secretUri
    fleetTableName: storage.outputs.fleetTableName
    queuePrefix: queuePrefix
    queueAccountNames: queueAccountNames
    consumerPolicy: consumerPolicy
    // The second source is read by the first app, the one infra/ lets read its hub.
    eventGridHub: (eventGridSource && i == 0) ? eventGridHubName : ''
    eventGridHealth: eventGridHealth
    eventGridAcknowledge: eventGridAcknowledge
    eventGridReconcileInterval: eventGridReconcile ? eventGridReconcileInterval : 0
    patchRuns: eventGridSource && patchRuns && i == 0
    patchRunOnBreach: patchRunOnBreach
    patchRunCancel: patchRunCancel
    weekAhead: weekAhead && i == 0
    weekAheadInterval: weekAheadInterval
    peopleClientId: peopleClientId
    peopleTenantId: peopleTenantId
    webhookSecretName: empty(notifyWebhookUrl) ? '' : keyVault.outputs.webhookSecretName
    keyVaultUri: keyVault.outputs.vaultUri
    notifyTargetName: notifyTargetName
    notifyTargetKind: notifyTargetKind
    workspaceId: workspace.outputs.workspaceId
    tags: tags
    diagnosticsWorkspaceId: diagnosticsWorkspaceId
  }
}]

module consumerRoles 'modules/consumer-roles.bicep' = [for i in range(0, eventHubNamespaceCount): {
  name: (i == 0) ? 'se-bridge-consumer-roles' : 'se-bridge-consumer-roles-${i}'
  params: {
    principalId: functionApp[i].outputs.identityPrincipalId
    eventHubsNamespaceName: eventHubs[i].outputs.namespaceName
    eventHubName: eventHubs[i].outputs.eventHubName
    storageAccountName: storage.outputs.accountName
    queueAccountNames: queueAccountNames
    dataCollectionRuleName: ingestion.outputs.ruleName
    keyVaultName: keyVault.outputs.vaultName
    signingKeySecretName: keyVault.outputs.secretName
    webhookSecretName: empty(notifyWebhookUrl) ? '' : keyVault.outputs.webhookSecretName
    insightsName: functionApp[i].outputs.insightsName
    consumerCreatesQueues: consumerCreatesQueues
  }
  dependsOn: [
    // queueAccountNames are names, not outputs: the queue accounts must exist first.
    queueStorage
  ]
}]

module alerts 'modules/alerts.bicep' = if (deployAlerts) {
  name: 'se-bridge-alerts'
  params: {
    namePrefix: prefix
    location: workspaceLocation
    workspaceId: workspace.outputs.workspaceId
    actionGroupId: actionGroupId
    approvalOverdueMinutes: approvalOverdueMinutes
    heartbeatMissingMinutes: heartbeatMissingMinutes
    spoolBacklogThreshold: spoolBacklogThreshold
    preemptThreshold: preemptThreshold
    askPendingMinutes: askPendingMinutes
    drainBlockedMinutes: drainBlockedMinutes
    pauseActiveHours: pauseActiveHours
    weekAhead: weekAhead
    upcomingBudgetBreakDays: upcomingBudgetBreakDays
    tags: tags
  }
  dependsOn: [
    // A query over SeBridgeRecords_CL is refused until the table exists.
    workspace
  ]
}

// The second source reads from the first namespace, with the first Function App's identity.
module eventGrid 'modules/eventgrid.bicep' = if (eventGridSource) {
  name: 'se-bridge-eventgrid'
  params: {
    eventHubsNamespaceName: eventHubs[0].outputs.namespaceName
    eventHubName: eventGridHubName
    consumerGroupName: consumerGroupName
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
    health: eventGridHealth
    prefix: '${prefix}-${suffix}'
    tags: tags
  }
}

// The first Function App's identity reads the second source, so it is the one that acknowledges.
module armAcknowledge 'modules/arm-acknowledge.bicep' = [for group in (empty(eventGridFleetResourceGroups) ? [resourceGroup().name] : eventGridFleetResourceGroups): if (eventGridSource && eventGridAcknowledge) {
  name: 'se-bridge-arm-acknowledge-${uniqueString(group)}'
  scope: resourceGroup(group)
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}]

// The same identity reads what Resource Graph holds of the fleet, for the reconciler.
module resourceGraphReader 'modules/resource-graph-reader.bicep' = [for group in (empty(eventGridFleetResourceGroups) ? [resourceGroup().name] : eventGridFleetResourceGroups): if (eventGridSource && eventGridReconcile) {
  name: 'se-bridge-resource-graph-reader-${uniqueString(group)}'
  scope: resourceGroup(group)
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}]

// Update Manager's runs reach the second source's hub; the consumer reads the configurations'
// assignments (Reader, as the reconciler reads the fleet's groups) and, with patchRunCancel,
// may cancel their runs.
module patchRunTopics 'modules/patch-runs.bicep' = if (eventGridSource && patchRuns) {
  name: 'se-bridge-patch-runs'
  params: {
    eventHubsNamespaceName: eventHubs[0].outputs.namespaceName
    eventHubName: eventGridHubName
    configurationIds: patchRunConfigurations
    location: patchRunConfigurationsLocation
    prefix: '${prefix}-${suffix}'
    tags: tags
  }
  dependsOn: [
    eventGrid
  ]
}

module patchRunReader 'modules/resource-graph-reader.bicep' = if (eventGridSource && patchRuns) {
  name: 'se-bridge-patch-run-reader'
  scope: resourceGroup(empty(patchRunConfigurationsResourceGroup) ? resourceGroup().name : patchRunConfigurationsResourceGroup)
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}

// The week ahead reads the configurations, their assignments and the fleet's VMs (Resource
// Graph answers only with the rows of resources its caller may read).
module weekAheadReader 'modules/resource-graph-reader.bicep' = [for group in (empty(weekAheadResourceGroups) ? [resourceGroup().name] : weekAheadResourceGroups): if (weekAhead) {
  name: 'se-bridge-week-ahead-reader-${uniqueString(group)}'
  scope: resourceGroup(group)
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}]

// Service Health's, AKS's and dynamic scopes' rows are the subscription's: read only by a
// reader of the subscription.
module weekAheadSubscriptionRead 'modules/subscription-reader.bicep' = if (weekAhead && weekAheadSubscriptionReader) {
  name: 'se-bridge-week-ahead-subscription-reader'
  scope: subscription()
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}

module patchRunCanceller 'modules/patch-run-cancel.bicep' = if (eventGridSource && patchRuns && patchRunCancel) {
  name: 'se-bridge-patch-run-cancel'
  scope: resourceGroup(empty(patchRunConfigurationsResourceGroup) ? resourceGroup().name : patchRunConfigurationsResourceGroup)
  params: {
    consumerPrincipalId: functionApp[0].outputs.identityPrincipalId
  }
}

module workbook 'modules/workbook.bicep' = if (deployWorkbook) {
  name: 'se-bridge-workbook'
  params: {
    location: workspaceLocation
    workspaceId: workspace.outputs.workspaceId
    tags: tags
  }
}

@description('eventhubs.namespace of the agents (the first namespace\'s).')
output eventHubsNamespace string = eventHubs[0].outputs.namespaceFqdn
@description('eventhubs.name of the agents.')
output eventHubName string = eventHubs[0].outputs.eventHubName
@description('Event Hubs namespace resource name (for infra/onboarding/vm.bicep; the first namespace\'s).')
output eventHubsNamespaceName string = eventHubs[0].outputs.namespaceName
@description('Every namespace\'s eventhubs.namespace: a VM sends to namespace (first 8 hex digits of its VmId) mod the count.')
output eventHubsNamespaces array = [for i in range(0, eventHubNamespaceCount): eventHubs[i].outputs.namespaceFqdn]
@description('Every namespace\'s resource name (for infra/onboarding/vm.bicep), in the order of eventHubsNamespaces.')
output eventHubsNamespaceNames array = [for i in range(0, eventHubNamespaceCount): eventHubs[i].outputs.namespaceName]
@description('loganalytics.endpoint: the data collection endpoint\'s logs ingestion URL.')
output logsIngestionEndpoint string = ingestion.outputs.logsIngestionEndpoint
@description('loganalytics.rule_id: the data collection rule\'s immutable id.')
output dataCollectionRuleImmutableId string = ingestion.outputs.ruleImmutableId
@description('Data collection rule resource name (for infra/onboarding/vm.bicep).')
output dataCollectionRuleName string = ingestion.outputs.ruleName
@description('Every data collection rule\'s resource name, when ingestionRuleCount is over 1: a VM posts to rule (first 8 hex digits of its VmId) mod the count.')
output dataCollectionRuleNames array = ingestion.outputs.ruleNames
@description('Every data collection rule\'s immutable id (loganalytics.rule_id), in the order of dataCollectionRuleNames.')
output dataCollectionRuleImmutableIds array = ingestion.outputs.ruleImmutableIds
@description('storage.account of the agents and the consumer.')
output storageAccountName string = storage.outputs.accountName
@description('Every storage account of the per-VM queues (storageAccountName first): a VM\'s storage.account is the one at index (first 8 hex digits of its VmId) mod the count.')
output queueStorageAccountNames array = queueAccountNames
@description('The Function App to publish functions/ to (the first namespace\'s).')
output functionAppName string = functionApp[0].outputs.appName
@description('Every Function App, one per namespace in the order of eventHubsNamespaces: publish functions/ to each.')
output functionAppNames array = [for i in range(0, eventHubNamespaceCount): functionApp[i].outputs.appName]
@description('Client id of the consumer\'s identity (the first Function App\'s).')
output consumerClientId string = functionApp[0].outputs.identityClientId
@description('The Key Vault holding the signing key.')
output keyVaultUri string = keyVault.outputs.vaultUri
@description('SE_BRIDGE_COMMANDS_SIGNING_KEY of a standalone consumer.')
output signingKeySetting string = 'keyvault:${keyVault.outputs.secretUri}'
@description('Per-VM queue prefix.')
output queuePrefix string = queuePrefix
@description('Resource id of the Log Analytics workspace.')
output workspaceId string = workspace.outputs.workspaceId
@description('eventgrid.hub of the consumer when eventGridSource is on; empty otherwise.')
output eventGridHub string = eventGridSource ? eventGrid.outputs.eventHubName : ''
