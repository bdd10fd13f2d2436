// A storage account for per-VM command queues only: accounts 1, 2, ... of main.bicep's
// queueAccountCount (account 0 is storage.bicep's, which also holds the fleet table and the
// Function Apps' storage). One account takes 20,000 requests a second in most regions
// (docs/capacity.md#azure-quotas). The same settings as storage.bicep's account: Entra ID only
// (shared-key access off), TLS 1.2, HTTPS only, no public blob access.

@description('Storage account name (3-24 lowercase letters and digits, globally unique).')
@minLength(3)
@maxLength(24)
param accountName string

param location string

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
  // checkov:skip=CKV_AZURE_35:Same reason: a default-deny firewall would shut out the agents (no VNet here).
  // checkov:skip=CKV_AZURE_206:Replication is a parameter (skuName); ZRS by default, a lost command is sent again by the consumer.
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

// Queues themselves are made per VM: by infra/onboarding/vm.bicep, or by the consumer with a
// VM's first command.
resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2026-04-01' = {
  parent: account
  name: 'default'
}

// Diagnostic settings stay on 2021-05-01-preview, the newest version: the only GA one (2016-09-01)
// has no categoryGroup or metric category, and wants a location, a metric timeGrain and the name 'service'.
// The account itself has metrics only; queue reads, writes and deletes are logged by the queue service.
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

output accountName string = account.name
output accountId string = account.id
output queueServiceName string = queueService.name
