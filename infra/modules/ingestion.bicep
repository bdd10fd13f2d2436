// The Logs Ingestion path: a data collection endpoint and a data collection rule whose stream
// declaration is generated from the record schema (infra/generated/schema.json) and whose
// transform is infra/kql/dcr-transform.kql. Agents and the consumer post to it with
// Monitoring Metrics Publisher on the rule.

@description('Data collection endpoint name.')
param endpointName string

@description('Data collection rule name.')
param ruleName string

@description('Region of the endpoint and the rule: the workspace\'s region.')
param location string

@description('Resource id of the Log Analytics workspace the rule writes to.')
param workspaceId string

param tags object = {}

var generated = loadJsonContent('../generated/schema.json')

resource endpoint 'Microsoft.Insights/dataCollectionEndpoints@2024-03-11' = {
  name: endpointName
  location: location
  tags: tags
  properties: {
    networkAcls: {
      // Agents post from VMs anywhere; Entra ID and the rule's role assignments guard it.
      publicNetworkAccess: 'Enabled'
    }
  }
}

resource rule 'Microsoft.Insights/dataCollectionRules@2024-03-11' = {
  name: ruleName
  location: location
  tags: tags
  properties: {
    description: 'se-bridge records into SeBridgeRecords_CL'
    dataCollectionEndpointId: endpoint.id
    streamDeclarations: {
      'Custom-SeBridgeRecords': generated.streamDeclaration
    }
    destinations: {
      logAnalytics: [
        {
          name: 'workspace'
          workspaceResourceId: workspaceId
        }
      ]
    }
    dataFlows: [
      {
        streams: [
          'Custom-SeBridgeRecords'
        ]
        destinations: [
          'workspace'
        ]
        transformKql: trim(loadTextContent('../kql/dcr-transform.kql'))
        outputStream: 'Custom-SeBridgeRecords_CL'
      }
    ]
  }
}

output ruleName string = rule.name
output ruleId string = rule.id
output ruleImmutableId string = rule.properties.immutableId
output logsIngestionEndpoint string = endpoint.properties.logsIngestion.endpoint
