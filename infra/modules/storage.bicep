// The storage account for the per-VM command queues (the first of main.bicep's queueAccountCount;
// the others are modules/queues.bicep), the fleet state table, the standalone consumer's
// checkpoints and the Function Apps' own host storage and deployment packages (one container per
// app). Shared-key access is off: everything authenticates with Entra ID.

@description('Storage account name (3-24 lowercase letters and digits, globally unique).')
@minLength(3)
@maxLength(24)
param accountName string

param location string

@description('Table of the fleet state (consumer.table_name).')
param fleetTableName string

@description('Blob container of the standalone consumer\'s Event Hubs checkpoints (consumer.checkpoint_container).')
param checkpointContainerName string

@description('Blob container the Flex Consumption plan deploys the Function App package from (the first app\'s; the others add -1, -2, ...).')
param deploymentContainerName string

@description('How many Function Apps deploy from this account: each needs a container of its own.')
@minValue(1)
@maxValue(20)
param deploymentContainerCount int = 1

@description('Replication of the account.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param skuName string = 'Standard_ZRS'

param tags object = {}

@description('Log Analytics workspace that receives this resource\'s logs and metrics (diagnostic settings); empty: none.')
param diagnosticsWorkspaceId string = ''

resource account 'Microsoft.Storage/storageAccounts@2026-04-01' = {
  // checkov:skip=CKV_AZURE_59:Agents on VMs anywhere read their own queue over the internet; Entra ID with per-queue roles guards access, shared keys are off.
  // checkov:skip=CKV_AZURE_35:Same reason: a default-deny firewall would shut out the agents and the Flex Consumption app (no VNet here).
  // checkov:skip=CKV_AZURE_206:Replication is a parameter (skuName); ZRS by default, the state is rebuilt from Event Hubs if lost.
  // checkov:skip=CKV_AZURE_43:The name is a parameter (checkov cannot resolve it); @minLength/@maxLength and Azure enforce the rules.
  name: accountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2026-04-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource checkpointContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-04-01' = {
  parent: blobService
  name: checkpointContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource deploymentContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-04-01' = [for i in range(0, deploymentContainerCount): {
  parent: blobService
  name: (i == 0) ? deploymentContainerName : '${deploymentContainerName}-${i}'
  properties: {
    publicAccess: 'None'
  }
}]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2026-04-01' = {
  parent: account
  name: 'default'
}

resource fleetTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2026-04-01' = {
  parent: tableService
  name: fleetTableName
}

// Queues themselves are made per VM: by infra/onboarding/vm.bicep, or by the consumer with a
// VM's first command.
resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2026-04-01' = {
  parent: account
  name: 'default'
}

// Diagnostic settings stay on 2021-05-01-preview, the newest version: the only GA one (2016-09-01)
// has no categoryGroup or metric category, and wants a location, a metric timeGrain and the name 'service'.
// The account itself has metrics only; reads, writes and deletes are logged per service.
resource accountDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: account
  properties: {
    workspaceId: diagnosticsWorkspaceId
    metrics: [
      {
        category: 'Transaction'
        enabled: true
      }
    ]
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: blobService
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: queueService
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

resource tableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: tableService
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

output accountName string = account.name
output accountId string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
output deploymentContainerName string = deploymentContainers[0].name
output deploymentContainerNames array = [for i in range(0, deploymentContainerCount): deploymentContainers[i].name]
output fleetTableName string = fleetTable.name
output queueServiceName string = queueService.name
