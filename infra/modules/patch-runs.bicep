// Update Manager's patch runs (preview events, issue 40; docs/planned-disruptions.md): each
// maintenance configuration named has a system topic (type Microsoft.Maintenance.
// MaintenanceConfigurations, in the configuration's region) whose event subscription delivers
// its pre- and post-maintenance events to the second source's event hub, which the consumer
// already reads (modules/eventgrid.bicep). Deployed only with main.bicep's eventGridSource and
// patchRuns. The run's VMs are read through Resource Graph with the Reader role the
// reconciler's module grants (modules/resource-graph-reader.bicep) on the fleet's groups and on
// the configurations' group.
//
// As for the scheduled-events topic, each topic delivers with its own identity, which may send
// to that one hub and nothing else.

@description('Event Hubs namespace of the second source\'s hub.')
param eventHubsNamespaceName string

@description('The second source\'s event hub (SE_BRIDGE_EVENTGRID_HUB).')
param eventHubName string = 'eventgrid'

@description('Resource ids of the maintenance configurations whose runs se-bridge counts.')
param configurationIds array

@description('The configurations\' region (a system topic is in its source\'s region).')
param location string

@description('Name prefix of the system topics.')
param prefix string

param tags object = {}

// Built-in role definition ids (Azure built-in roles):
var eventHubsDataSender = '2b629674-e913-4c01-ae53-ef4638d8f975' // Azure Event Hubs Data Sender

resource namespace 'Microsoft.EventHub/namespaces@2026-01-01' existing = {
  name: eventHubsNamespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2026-01-01' existing = {
  parent: namespace
  name: eventHubName
}

resource topics 'Microsoft.EventGrid/systemTopics@2025-02-15' = [for (id, i) in configurationIds: {
  name: '${prefix}-patch-${i}'
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: id
    topicType: 'Microsoft.Maintenance.MaintenanceConfigurations'
  }
}]

resource topicSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (id, i) in configurationIds: {
  name: guid(hub.id, topics[i].id, eventHubsDataSender)
  scope: hub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataSender)
    principalId: topics[i].identity.principalId
    principalType: 'ServicePrincipal'
  }
}]

// Only the two event types se-bridge reads (Microsoft's page names each one way).
resource subscriptions 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = [for (id, i) in configurationIds: {
  parent: topics[i]
  name: 'se-bridge'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    filter: {
      includedEventTypes: [
        'Microsoft.Maintenance.PreMaintenanceEvent'
        'Microsoft.Maintenance.PostMaintenanceEvent'
      ]
    }
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
    // A pre-event is worth nothing after the run's cut-off (about 20 minutes after it is sent).
    retryPolicy: {
      maxDeliveryAttempts: 10
      eventTimeToLiveInMinutes: 30
    }
  }
  dependsOn: [
    topicSenders
  ]
}]

output topicNames array = [for (id, i) in configurationIds: topics[i].name]
