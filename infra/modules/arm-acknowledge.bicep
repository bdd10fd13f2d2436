// ARM's acknowledge as the carrier of last resort (preview, issue 36; docs/second-source.md):
// the consumer's identity may approve the scheduled events of this resource group's VMs, scale
// sets and availability sets, when no live agent can (eventgrid.acknowledge). Deployed into
// each of the fleet's resource groups, only with main.bicep's eventGridSource and
// eventGridAcknowledge.
//
// Scheduled Events Contributor is the narrowest built-in role that allows it:
// Microsoft.Maintenance/scheduledevents/acknowledge/action, and reading VMs, scale sets and
// availability sets; nothing that starts, stops or changes a VM.

@description('Object id of the consumer\'s identity.')
param consumerPrincipalId string

// Built-in role definition ids (Azure built-in roles):
var scheduledEventsContributor = 'b67fe603-310e-4889-b9ee-8257d09d353d' // Scheduled Events Contributor

resource acknowledge 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, consumerPrincipalId, scheduledEventsContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scheduledEventsContributor)
    principalId: consumerPrincipalId
    principalType: 'ServicePrincipal'
  }
}
