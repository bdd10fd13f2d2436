// The Resource Graph reconciler's reading (preview, issue 36; docs/second-source.md): the
// consumer's identity may read this resource group's scheduled events (maintenanceresources)
// and VM health (healthresources) through Azure Resource Graph, which answers a query only with
// the rows of resources its caller may read. Deployed into each of the fleet's resource groups,
// only with main.bicep's eventGridSource and eventGridReconcile.
//
// Reader is the narrowest built-in role that reads both: */read on the group's resources,
// no action, no data action (it reads no queue, table, blob or secret).

@description('Object id of the consumer\'s identity.')
param consumerPrincipalId string

// Built-in role definition ids (Azure built-in roles):
var reader = 'acdd72a7-3385-48ef-bd42-f606fba81ae7' // Reader

resource read 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, consumerPrincipalId, reader)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)
    principalId: consumerPrincipalId
    principalType: 'ServicePrincipal'
  }
}
