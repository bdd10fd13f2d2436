// Azure's own view of the fleet (preview, issue 36; docs/second-source.md): the scheduled-events
// system topic of this subscription (and, with health, the resource-health one), each delivering
// through an event subscription to an event hub `eventgrid` beside the records' hub, which the
// consumer reads with its own identity. Deployed only with main.bicep's eventGridSource.
//
// Event Grid delivers with the system topic's own identity (the namespace takes no SAS keys):
// it may send to that one hub and nothing else; the consumer may only read it. Anyone who may
// send to the hub could forge a delivery, which is why nobody else may.

@description('Event Hubs namespace of the records\' hub (modules/eventhubs.bicep), where the hub `eventgrid` goes.')
param eventHubsNamespaceName string

@description('Event hub the system topics deliver to (SE_BRIDGE_EVENTGRID_HUB).')
param eventHubName string = 'eventgrid'

@description('Consumer group the consumer reads with (SE_BRIDGE_CONSUMER_CONSUMER_GROUP).')
param consumerGroupName string

@description('Partitions of the hub: Event Grid sends without a partition key, spread over them.')
@minValue(1)
@maxValue(32)
param partitionCount int = 2

@description('Object id of the consumer\'s identity: given Data Receiver on this hub only.')
param consumerPrincipalId string

@description('Also the resource-health system topic (eventgrid.health): VMs Azure reports Unavailable or Degraded count as impacted.')
param health bool = false

@description('Name prefix of the system topics (one of each type per subscription).')
param prefix string

param tags object = {}

// Built-in role definition ids (Azure built-in roles):
var eventHubsDataSender = '2b629674-e913-4c01-ae53-ef4638d8f975' // Azure Event Hubs Data Sender
var eventHubsDataReceiver = 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde' // Azure Event Hubs Data Receiver

// The topic types, as Azure names them (the overview page names the first differently; this is
// the one `az eventgrid system-topic create --topic-type` takes).
var topicTypes = health ? [
  'Microsoft.ResourceNotifications.MaintenanceResources'
  'Microsoft.ResourceNotifications.HealthResources'
] : [
  'Microsoft.ResourceNotifications.MaintenanceResources'
]

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' existing = {
  name: eventHubsNamespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' = {
  parent: namespace
  name: eventHubName
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: 7
  }
}

resource consumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2026-01-01' = {
  parent: hub
  name: consumerGroupName
  properties: {
    userMetadata: 'se-bridge consumer (Event Grid, the second source)'
  }
}

resource topics 'Microsoft.EventGrid/systemTopics@2025-02-15' = [for (topicType, i) in topicTypes: {
  name: '${prefix}-${i == 0 ? 'maintenance' : 'health'}'
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: topicType
  }
}]

// Each topic's identity may send to the hub (and only to it).
resource topicSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (topicType, i) in topicTypes: {
  name: guid(hub.id, topics[i].id, eventHubsDataSender)
  scope: hub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataSender)
    principalId: topics[i].identity.principalId
    principalType: 'ServicePrincipal'
  }
}]

// No filter on the event type: Microsoft's page names the scheduled event's two ways, and a
// filter on the wrong one would drop every event. The consumer refuses what it does not read.
resource subscriptions 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = [for (topicType, i) in topicTypes: {
  parent: topics[i]
  name: 'se-bridge'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'EventHub'
        properties: {
          resourceId: hub.id
        }
      }
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
  dependsOn: [
    topicSenders
  ]
}]

// The consumer reads the hub.
resource consumerReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, consumerPrincipalId, eventHubsDataReceiver)
  scope: hub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataReceiver)
    principalId: consumerPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output eventHubName string = hub.name
output topicNames array = [for (topicType, i) in topicTypes: topics[i].name]
