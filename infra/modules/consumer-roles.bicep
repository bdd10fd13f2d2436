// Role assignments of the consumer's (Function App's) identity: only what it uses. main.bicep
// calls this once per Function App: its own namespace, the shared storage account, every queue
// account, the data collection rule, the signing key and its own Application Insights.

@description('Object id of the consumer\'s user-assigned identity.')
param principalId string

param eventHubsNamespaceName string
param eventHubName string
param storageAccountName string

@description('Every storage account of the per-VM queues (storageAccountName first): the consumer sends to a VM\'s queue in whichever account holds it.')
param queueAccountNames array

param dataCollectionRuleName string
param keyVaultName string
param signingKeySecretName string

@description('Name of the secret that holds the notification webhook\'s URL; empty: no webhook, no role.')
param webhookSecretName string = ''
param insightsName string

@description('True: Storage Queue Data Contributor, so the consumer creates a VM\'s queue with its first command. False: Message Sender only; every VM must then be onboarded with infra/onboarding/vm.bicep, which creates its queue.')
param consumerCreatesQueues bool = true

// Built-in role definition ids (Azure built-in roles):
var eventHubsDataReceiver = 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde' // Azure Event Hubs Data Receiver
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor
var storageQueueDataMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a' // Storage Queue Data Message Sender
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6' // Key Vault Secrets User

var queueRole = consumerCreatesQueues ? storageQueueDataContributor : storageQueueDataMessageSender

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' existing = {
  name: eventHubsNamespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' existing = {
  parent: namespace
  name: eventHubName
}

resource account 'Microsoft.Storage/storageAccounts@2026-04-01' existing = {
  name: storageAccountName
}

resource queueAccounts 'Microsoft.Storage/storageAccounts@2026-04-01' existing = [for name in queueAccountNames: {
  name: name
}]

resource rule 'Microsoft.Insights/dataCollectionRules@2024-03-11' existing = {
  name: dataCollectionRuleName
}

resource vault 'Microsoft.KeyVault/vaults@2026-02-01' existing = {
  name: keyVaultName
}

resource secret 'Microsoft.KeyVault/vaults/secrets@2026-02-01' existing = {
  parent: vault
  name: signingKeySecretName
}

resource webhookSecret 'Microsoft.KeyVault/vaults/secrets@2026-02-01' existing = if (!empty(webhookSecretName)) {
  parent: vault
  name: webhookSecretName
}

resource insights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: insightsName
}

// Read the records (the Event Hubs trigger).
resource hubReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, principalId, eventHubsDataReceiver)
  scope: hub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataReceiver)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Host storage (Event Hubs checkpoints and leases, timer locks), the deployment package, and the
// standalone consumer's checkpoint container: the Functions host requires Blob Data Owner.
resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, principalId, storageBlobDataOwner)
  scope: account
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// The fleet state table (the consumer creates it if missing, so the account scope).
resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, principalId, storageTableDataContributor)
  scope: account
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Send approvals to every VM's queue (and create a queue with its first command), in every queue
// account. The first account is storageAccountName: its assignment keeps the name it always had.
resource queueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for i in range(0, length(queueAccountNames)): {
  name: guid(queueAccounts[i].id, principalId, queueRole)
  scope: queueAccounts[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueRole)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}]

// Decision records to the Logs Ingestion API.
resource rulePublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(rule.id, principalId, monitoringMetricsPublisher)
  scope: rule
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Telemetry to Application Insights with Entra ID (local auth is off there).
resource insightsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(insights.id, principalId, monitoringMetricsPublisher)
  scope: insights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Read the command-signing key: this one secret, nothing else in the vault.
resource secretUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(secret.id, principalId, keyVaultSecretsUser)
  scope: secret
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Read the notification webhook's URL ([notify]): that one secret too, when there is one.
resource webhookSecretUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(webhookSecretName)) {
  name: guid(webhookSecret.id, principalId, keyVaultSecretsUser)
  scope: webhookSecret
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}
