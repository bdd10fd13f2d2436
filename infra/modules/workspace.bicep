// The Log Analytics workspace (new, or an existing one) and the SeBridgeRecords_CL table.
// Deployed into the workspace's resource group, which may differ from se-bridge's.

@description('Workspace name.')
param workspaceName string

@description('Create the workspace (true) or use an existing one of this name in this resource group (false).')
param createWorkspace bool

param location string

@description('Days records stay in the workspace (new workspace) and in the table.')
@minValue(30)
@maxValue(730)
param retentionInDays int

param tags object = {}

// Columns generated from bridge/record.schema.json by `python -m tools.gen_infra`.
var generated = loadJsonContent('../generated/schema.json')

resource newWorkspace 'Microsoft.OperationalInsights/workspaces@2026-03-01' = if (createWorkspace) {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource workspace 'Microsoft.OperationalInsights/workspaces@2026-03-01' existing = {
  name: workspaceName
}

resource table 'Microsoft.OperationalInsights/workspaces/tables@2026-03-01' = {
  parent: workspace
  name: 'SeBridgeRecords_CL'
  properties: {
    plan: 'Analytics'
    retentionInDays: retentionInDays
    schema: {
      name: 'SeBridgeRecords_CL'
      description: 'se-bridge records (Scheduled Events, heartbeats, hooks, approvals, decisions); see bridge/record.schema.json'
      columns: generated.tableColumns
    }
  }
  dependsOn: [
    newWorkspace
  ]
}

output workspaceId string = workspace.id
output tableName string = table.name
