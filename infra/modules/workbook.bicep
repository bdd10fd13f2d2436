// The se-bridge workbook (infra/workbook/se-bridge.workbook.json): upcoming and ongoing
// maintenance, a timeline per scale set, time to approval, agents' health.

param location string

@description('Resource id of the Log Analytics workspace the workbook queries.')
param workspaceId string

param displayName string = 'se-bridge: Scheduled Events across the fleet'

param tags object = {}

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  // The name of a workbook must be a GUID; derived so redeploying updates the same one.
  name: guid(resourceGroup().id, workspaceId, 'se-bridge-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    sourceId: workspaceId
    serializedData: string(loadJsonContent('../workbook/se-bridge.workbook.json'))
  }
}

output workbookId string = workbook.id
