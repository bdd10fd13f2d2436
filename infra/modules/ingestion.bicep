// The Logs Ingestion path: a data collection endpoint and a data collection rule whose stream
// declaration is generated from the record schema (infra/generated/schema.json) and whose
// transform is infra/kql/dcr-transform.kql. Agents and the consumer post to it with
// Monitoring Metrics Publisher on the rule. Past about 50,000 VMs one rule's request quota
// (12,000 a minute) is not enough: ruleCount rules, identical, spread the agents over them
// (docs/capacity.md#azure-quotas).

@description('Data collection endpoint name.')
param endpointName string

@description('Data collection rule name (the first rule\'s; the others add -1, -2, ...).')
param ruleName string

@description('How many identical rules to create: each VM posts to one of them.')
@minValue(1)
@maxValue(20)
param ruleCount int = 1

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

resource rules 'Microsoft.Insights/dataCollectionRules@2024-03-11' = [for i in range(0, ruleCount): {
  name: (i == 0) ? ruleName : '${ruleName}-${i}'
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
}]

// The first rule: the consumer's, and every agent's when there is one.
output ruleName string = rules[0].name
output ruleId string = rules[0].id
output ruleImmutableId string = rules[0].properties.immutableId
output ruleNames array = [for i in range(0, ruleCount): rules[i].name]
output ruleImmutableIds array = [for i in range(0, ruleCount): rules[i].properties.immutableId]
output logsIngestionEndpoint string = endpoint.properties.logsIngestion.endpoint
