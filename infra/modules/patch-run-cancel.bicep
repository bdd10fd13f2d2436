// Cancelling a patch run (preview API, issue 40; docs/planned-disruptions.md): the consumer's
// identity may cancel the runs of this resource group's maintenance configurations through the
// maintenance RP's applyUpdates (status Cancel), when patchruns.cancel allows it. Deployed into
// the configurations' resource group, only with main.bicep's eventGridSource, patchRuns and
// patchRunCancel.
//
// A custom role, because no built-in role is this narrow: Scheduled Patching Contributor and
// Virtual Machine Contributor also write maintenance configurations and their assignments
// (who is patched, and when), or the VMs themselves. This one may only read the
// configurations and write their applyUpdates: it cannot change a schedule, assign a VM,
// start a run on a VM (an applyUpdates under a VM is a compute resource's, outside this group)
// or touch any other resource.

@description('Object id of the consumer\'s identity.')
param consumerPrincipalId string

var actions = [
  'Microsoft.Maintenance/maintenanceConfigurations/read'
  'Microsoft.Maintenance/applyUpdates/read'
  'Microsoft.Maintenance/applyUpdates/write'
]

resource canceller 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'se-bridge patch run canceller')
  properties: {
    roleName: 'se-bridge patch run canceller (${resourceGroup().name})'
    description: 'Cancels Update Manager runs of this group\'s maintenance configurations (applyUpdates, status Cancel) and reads them; nothing else.'
    type: 'CustomRole'
    permissions: [
      {
        actions: actions
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: [
      resourceGroup().id
    ]
  }
}

resource cancel 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, consumerPrincipalId, canceller.id)
  properties: {
    roleDefinitionId: canceller.id
    principalId: consumerPrincipalId
    principalType: 'ServicePrincipal'
  }
}
