// The week ahead's reading at the subscription (issue 40; docs/planned-disruptions.md#the-week-ahead):
// Service Health's planned maintenance events and the resources they impact, AKS's upgrade
// notices and maintenance configurations' dynamic scopes are rows of the subscription, which
// Resource Graph answers only to a reader of the subscription. Deployed to the subscription
// only with main.bicep's weekAhead and weekAheadSubscriptionReader.
//
// Reader is the narrowest built-in role that reads them: */read, no action, no data action (it
// reads no queue, table, blob or secret), on every resource of the subscription.

targetScope = 'subscription'

@description('Object id of the consumer\'s identity.')
param consumerPrincipalId string

// Built-in role definition ids (Azure built-in roles):
var reader = 'acdd72a7-3385-48ef-bd42-f606fba81ae7' // Reader

resource read 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(subscription().id, consumerPrincipalId, reader)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)
    principalId: consumerPrincipalId
    principalType: 'ServicePrincipal'
  }
}
