// Event Hubs: the stream every agent sends its records to and the consumer reads.
// Entra ID only (disableLocalAuth): agents and the consumer use managed identities, no SAS keys.

@description('Event Hubs namespace name (globally unique, 6-50 characters).')
param namespaceName string

@description('Region of the namespace.')
param location string

@description('Event hub the agents send to (SE_BRIDGE_EVENTHUBS_NAME).')
param eventHubName string

@description('Partitions of the hub: the consumer scales out to at most one Function instance per partition. Fixed after creation on Standard.')
@minValue(1)
@maxValue(32)
param partitionCount int

@description('Consumer group the Function App reads with (SE_BRIDGE_CONSUMER_CONSUMER_GROUP).')
param consumerGroupName string

@description('Days a record stays in the hub (1-7 on Standard): how long the consumer may be down without losing records.')
@minValue(1)
@maxValue(7)
param messageRetentionInDays int = 7

@description('Throughput units of the Standard namespace.')
@minValue(1)
@maxValue(40)
param capacity int = 1

param tags object = {}

@description('Log Analytics workspace that receives this resource\'s logs and metrics (diagnostic settings); empty: none.')
param diagnosticsWorkspaceId string = ''

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
    capacity: capacity
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    // Agents run on VMs anywhere (other VNets, other subscriptions); Entra ID guards access.
    publicNetworkAccess: 'Enabled'
  }
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' = {
  parent: namespace
  name: eventHubName
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: messageRetentionInDays
  }
}

resource consumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2026-01-01' = {
  parent: hub
  name: consumerGroupName
  properties: {
    userMetadata: 'se-bridge consumer (Azure Functions)'
  }
}

// Diagnostic settings stay on 2021-05-01-preview, the newest version: the only GA one (2016-09-01)
// has no categoryGroup or metric category, and wants a location, a metric timeGrain and the name 'service'.
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: namespace
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output namespaceName string = namespace.name
// serviceBusEndpoint is https://NAME.servicebus.windows.net:443/ (per cloud); the agent wants the host only.
output namespaceFqdn string = split(split(namespace.properties.serviceBusEndpoint, '//')[1], ':')[0]
output eventHubName string = hub.name
output eventHubId string = hub.id
output consumerGroupName string = consumerGroup.name
