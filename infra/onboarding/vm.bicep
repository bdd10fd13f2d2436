// Onboard one VM: its command queue and its identity's three role assignments, each scoped as
// narrowly as Azure allows. Deploy into se-bridge's resource group (the VM itself may live
// anywhere), once per VM:
//   az deployment group create -g RG -f infra/onboarding/vm.bicep \
//     -p vmId=VMID vmPrincipalId=PRINCIPAL storageAccountName=... eventHubsNamespaceName=... \
//        dataCollectionRuleName=...
// In a sharded deployment the VM's queue account, namespace and rule are those at index (the
// first 8 hex digits of its VmId) modulo their count in main.bicep's queueStorageAccountNames,
// eventHubsNamespaceNames and dataCollectionRuleNames (docs/deploying.md).
// VMs of a scale set share its identity: each instance gets its own queue, but the shared
// identity can read every instance's queue (the agent still acts only on its own VmId).

@description('The VM\'s vmId (az vm show --query vmId), as IMDS reports it.')
@minLength(1)
param vmId string

@description('Object (principal) id of the VM\'s managed identity (az vm show --query identity.principalId).')
param vmPrincipalId string

@description('Storage account holding this VM\'s command queue (main.bicep output storageAccountName, or this VM\'s entry of queueStorageAccountNames).')
param storageAccountName string

@description('Event Hubs namespace resource name (main.bicep output eventHubsNamespaceName, or this VM\'s entry of eventHubsNamespaceNames).')
param eventHubsNamespaceName string

@description('Event hub the agents send to.')
param eventHubName string = 'records'

@description('Data collection rule resource name (main.bicep output dataCollectionRuleName, or this VM\'s entry of dataCollectionRuleNames).')
param dataCollectionRuleName string

@description('commands.queue_prefix of the agent and the consumer.')
param queuePrefix string = 'se-bridge-'

// The agent's rule (bridge/channels/storagequeue.py queue_name): prefix + VmId stripped and in
// lowercase. Azure refuses a name outside 3-63 lowercase letters, digits and single hyphens.
var queueName = '${queuePrefix}${toLower(trim(vmId))}'

// Built-in role definition ids (Azure built-in roles):
var eventHubsDataSender = '2b629674-e913-4c01-ae53-ef4638d8f975' // Azure Event Hubs Data Sender
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher
var storageQueueDataMessageProcessor = '8a0f0c08-91a1-4084-bc3d-661d67233fed' // Storage Queue Data Message Processor

resource account 'Microsoft.Storage/storageAccounts@2026-04-01' existing = {
  name: storageAccountName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2026-04-01' existing = {
  parent: account
  name: 'default'
}

resource queue 'Microsoft.Storage/storageAccounts/queueServices/queues@2026-04-01' = {
  parent: queueService
  name: queueName
  properties: {
    metadata: {
      vmid: toLower(trim(vmId))
    }
  }
}

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' existing = {
  name: eventHubsNamespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' existing = {
  parent: namespace
  name: eventHubName
}

resource rule 'Microsoft.Insights/dataCollectionRules@2024-03-11' existing = {
  name: dataCollectionRuleName
}

// Read and delete approvals from its own queue only: no VM can see another VM's commands.
resource queueProcessor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, vmPrincipalId, storageQueueDataMessageProcessor)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageProcessor)
    principalId: vmPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Send records to the hub.
resource hubSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, vmPrincipalId, eventHubsDataSender)
  scope: hub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataSender)
    principalId: vmPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Upload records to the Logs Ingestion API through the rule.
resource rulePublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(rule.id, vmPrincipalId, monitoringMetricsPublisher)
  scope: rule
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: vmPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output queueName string = queue.name
