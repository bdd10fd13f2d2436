// The consumer as an Azure Functions app (functions/, Python 3.11) on the Flex Consumption plan,
// one per Event Hubs namespace (main.bicep's eventHubNamespaceCount), with a user-assigned
// identity so its roles exist before the host first starts. Host storage
// (AzureWebJobsStorage) and the deployment package use that identity: the storage account has
// shared-key access off. App settings are exactly those of docs/approvals.md ("Running the
// consumer in Azure Functions") plus the Application Insights connection. With an Entra ID app
// registration (peopleClientId, docs/people.md), its HTTP functions (the approval page and API)
// sit behind App Service Authentication, and with a webhook secret it notifies people.

@description('Function App name (globally unique).')
param appName string

param location string

@description('Storage account for host storage, the deployment package, the fleet table and the queues (the first queue account).')
param storageAccountName string

@description('Blob endpoint of that account (https://NAME.blob.core.windows.net/).')
param blobEndpoint string

@description('Container of the deployment package.')
param deploymentContainerName string

@description('Event Hubs namespace host name (NAME.servicebus.windows.net).')
param eventHubsNamespaceFqdn string

param eventHubName string
param consumerGroupName string

@description('Logs ingestion endpoint (the DCE\'s) and the DCR\'s immutable id, for Decision records.')
param logsIngestionEndpoint string
param dataCollectionRuleImmutableId string

@description('Key Vault secret URI of the signing key: https://VAULT.vault.azure.net/secrets/NAME.')
param signingKeySecretUri string

param fleetTableName string
param queuePrefix string

@description('Every storage account of the per-VM queues, storageAccountName first (SE_BRIDGE_COMMANDS_QUEUE_ACCOUNTS when there are several): a VM\'s queue is in the account at index (the first 8 hex digits of its VmId) modulo their number.')
param queueAccountNames array = []

@description('With main.bicep\'s eventGridSource, on the app whose identity may read it: the event hub the system topics deliver to (SE_BRIDGE_EVENTGRID_HUB), in this app\'s namespace, read through the same Event Hubs connection. Empty: no second source, and no eventgrid function.')
param eventGridHub string = ''

@description('With eventGridHub: resource health counts in the budgets (SE_BRIDGE_EVENTGRID_HEALTH).')
param eventGridHealth bool = false

@description('With eventGridHub: approve through ARM\'s acknowledge what no live agent can carry (SE_BRIDGE_EVENTGRID_ACKNOWLEDGE).')
param eventGridAcknowledge bool = false

@description('With eventGridHub: seconds between two passes of the Resource Graph reconciler, the app\'s reconcile timer (SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL); 0: none.')
param eventGridReconcileInterval int = 0

@description('With eventGridHub: count Update Manager\'s patch runs in the budgets (SE_BRIDGE_PATCHRUNS_ENABLED).')
param patchRuns bool = false

@description('With patchRuns: what a run over a budget gets (SE_BRIDGE_PATCHRUNS_ON_BREACH).')
@allowed(['run', 'ask', 'cancel'])
param patchRunOnBreach string = 'run'

@description('With patchRuns: the consumer may cancel a run (SE_BRIDGE_PATCHRUNS_CANCEL).')
param patchRunCancel bool = false

@description('Read the week ahead (SE_BRIDGE_WEEKAHEAD_ENABLED): the app\'s weekahead timer.')
param weekAhead bool = false

@description('With weekAhead: seconds between two reads (SE_BRIDGE_WEEKAHEAD_INTERVAL).')
param weekAheadInterval int = 21600

@description('Optional policy file deployed with the app (SE_BRIDGE_CONSUMER_POLICY), such as policy.yaml; empty: the default policy.')
param consumerPolicy string = ''

@description('Resource id of the Log Analytics workspace Application Insights stores its data in.')
param workspaceId string

@description('Maximum Flex Consumption instances.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Client id of the Entra ID app registration people sign in to for the approval page and API (infra/people/decide-app.sh creates it, with the SeBridge.Decide app role). Empty: no App Service Authentication and no people settings.')
param peopleClientId string = ''

@description('Entra ID tenant (directory) id whose people may sign in.')
param peopleTenantId string = tenant().tenantId

@description('Name of the Key Vault secret holding the notification webhook\'s URL; empty: no notification target.')
param webhookSecretName string = ''

@description('The Key Vault holding it (https://VAULT.vault.azure.net/).')
param keyVaultUri string = ''

@description('Name of that notification target, as a policy\'s ask.target names it.')
param notifyTargetName string = 'people'

@description('What the webhook takes: generic JSON, a Microsoft Teams workflow (Adaptive Card) or Slack.')
@allowed([
  'generic'
  'teams'
  'slack'
])
param notifyTargetKind string = 'generic'

param tags object = {}

@description('Log Analytics workspace that receives this resource\'s logs and metrics (diagnostic settings); empty: none.')
param diagnosticsWorkspaceId string = ''

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2024-11-30' = {
  name: 'id-${appName}'
  location: location
  tags: tags
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: 'appi-${appName}'
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspaceId
    // Telemetry authenticates with the identity (Monitoring Metrics Publisher), not the key.
    DisableLocalAuth: true
  }
}

resource plan 'Microsoft.Web/serverfarms@2025-03-01' = {
  // checkov:skip=CKV_AZURE_225:Zone redundancy is not a Flex Consumption plan property here.
  name: 'plan-${appName}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

var baseSettings = {
  // Functions host: the Event Hubs trigger's identity-based connection (connection = SE_BRIDGE_EVENTHUBS).
  SE_BRIDGE_EVENTHUBS__fullyQualifiedNamespace: eventHubsNamespaceFqdn
  SE_BRIDGE_EVENTHUBS__credential: 'managedidentity'
  SE_BRIDGE_EVENTHUBS__clientId: identity.properties.clientId
  SE_BRIDGE_EVENTHUBS_NAME: eventHubName
  SE_BRIDGE_CONSUMER_CONSUMER_GROUP: consumerGroupName
  // Functions host storage (checkpoints, leases, timer locks) with the identity.
  AzureWebJobsStorage__accountName: storageAccountName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identity.properties.clientId
  SE_BRIDGE_CONSUMER_STATE: 'tables'
  SE_BRIDGE_CONSUMER_TABLE_NAME: fleetTableName
  SE_BRIDGE_COMMANDS_CHANNEL: 'storagequeue'
  SE_BRIDGE_COMMANDS_QUEUE_PREFIX: queuePrefix
  SE_BRIDGE_COMMANDS_SIGNING_KEY: 'keyvault:${signingKeySecretUri}'
  SE_BRIDGE_STORAGE_ACCOUNT: storageAccountName
  SE_BRIDGE_STORAGE_ENDPOINT_SUFFIX: environment().suffixes.storage
  SE_BRIDGE_IDENTITY_KIND: 'managed'
  SE_BRIDGE_IDENTITY_CLIENT_ID: identity.properties.clientId
  SE_BRIDGE_LOGANALYTICS_ENDPOINT: logsIngestionEndpoint
  SE_BRIDGE_LOGANALYTICS_RULE_ID: dataCollectionRuleImmutableId
  APPLICATIONINSIGHTS_CONNECTION_STRING: insights.properties.ConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identity.properties.clientId};Authorization=AAD'
}

var policySettings = empty(consumerPolicy) ? {} : {
  SE_BRIDGE_CONSUMER_POLICY: consumerPolicy
}

// Azure's own view, the second source ([eventgrid], docs/second-source.md): the app registers its
// eventgrid function only with SE_BRIDGE_EVENTGRID_ENABLED (its reconcile timer only with a
// SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL over 0), and trusts deliveries of this subscription's
// system topics only.
var eventGridSettings = empty(eventGridHub) ? {} : {
  SE_BRIDGE_EVENTGRID_ENABLED: 'true'
  SE_BRIDGE_EVENTGRID_HUB: eventGridHub
  SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS: subscription().subscriptionId
  SE_BRIDGE_EVENTGRID_HEALTH: eventGridHealth ? 'true' : 'false'
  SE_BRIDGE_EVENTGRID_ACKNOWLEDGE: eventGridAcknowledge ? 'true' : 'false'
  SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL: string(eventGridReconcileInterval)
  SE_BRIDGE_PATCHRUNS_ENABLED: patchRuns ? 'true' : 'false'
  SE_BRIDGE_PATCHRUNS_ON_BREACH: patchRunOnBreach
  SE_BRIDGE_PATCHRUNS_CANCEL: patchRunCancel ? 'true' : 'false'
}

// The week ahead ([weekahead], docs/planned-disruptions.md): the app registers its weekahead
// timer only with SE_BRIDGE_WEEKAHEAD_ENABLED, and reads this subscription's configurations.
var weekAheadSettings = weekAhead ? {
  SE_BRIDGE_WEEKAHEAD_ENABLED: 'true'
  SE_BRIDGE_WEEKAHEAD_INTERVAL: string(weekAheadInterval)
  SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS: subscription().subscriptionId
} : {}

// One account: SE_BRIDGE_STORAGE_ACCOUNT holds the queues, as before.
var queueSettings = (length(queueAccountNames) > 1) ? {
  SE_BRIDGE_COMMANDS_QUEUE_ACCOUNTS: join(queueAccountNames, ',')
} : {}

// People in the loop ([consumer.people]): the approval API accepts Entra ID tokens of this tenant
// issued for the app registration, by its Application ID URI or its client id (the audiences App
// Service Authentication allows below).
var peopleSettings = empty(peopleClientId) ? {} : {
  SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID: peopleTenantId
  SE_BRIDGE_CONSUMER_PEOPLE_AUDIENCE: 'api://${peopleClientId},${peopleClientId}'
}

// Notifications ([notify]): one target whose URL the consumer reads from Key Vault with its
// identity at start (as it reads the signing key), so the URL is in no app setting; notices link
// to the approval page when there is one.
var notifySettings = empty(webhookSecretName) ? {} : {
  SE_BRIDGE_NOTIFY_TARGETS: string([
    {
      name: notifyTargetName
      kind: notifyTargetKind
      url_secret: webhookSecretName
    }
  ])
  SE_BRIDGE_NOTIFY_KEY_VAULT: keyVaultUri
  SE_BRIDGE_NOTIFY_PAGE_URL: empty(peopleClientId) ? '' : 'https://${app.properties.defaultHostName}/'
}

resource app 'Microsoft.Web/sites@2025-03-01' = {
  // checkov:skip=CKV_AZURE_67:Flex Consumption pins the runtime through functionAppConfig.runtime (python 3.11), not siteConfig.
  // checkov:skip=CKV_AZURE_222:Its only HTTP functions, the approval page and API, sit behind App Service Authentication with Entra ID (authsettingsV2 below); public access stays on for people and for code deployment without a VNet.
  // checkov:skip=CKV_AZURE_17:People sign in with Entra ID (App Service Authentication), not client certificates; the other functions are an Event Hubs trigger and a timer.
  // checkov:skip=CKV_AZURE_212:Flex Consumption scales by itself (maximumInstanceCount); it has no minimum instance count to set.
  // checkov:skip=CKV_AZURE_213:Nothing to probe: the work is an Event Hubs trigger and a timer, and the only HTTP functions require a signed-in person.
  name: appName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    clientCertEnabled: false
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identity.id
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

resource settings 'Microsoft.Web/sites/config@2025-03-01' = {
  // checkov reads this app-settings resource as a web config; none of these apply to it:
  // checkov:skip=CKV_AZURE_66:Failed request tracing is a site setting, not an app setting; the functions, the page included, log to Application Insights.
  // checkov:skip=CKV_AZURE_63:HTTP logging likewise; the functions log to Application Insights.
  // checkov:skip=CKV_AZURE_65:Detailed HTTP error pages likewise.
  // checkov:skip=CKV_AZURE_222:Public network access is a site property; see the site above.
  // checkov:skip=CKV_AZURE_80:A Python app: no .NET Framework.
  // checkov:skip=CKV_AZURE_13:App Service Authentication is its own resource (authsettingsV2 below), on whenever the app serves the approval page.
  // checkov:skip=CKV_AZURE_88:Azure Files is not used: Flex Consumption deploys from blob storage and shared keys are off.
  parent: app
  name: 'appsettings'
  properties: union(baseSettings, policySettings, queueSettings, peopleSettings, notifySettings, eventGridSettings, weekAheadSettings)
}

// App Service Authentication ("Easy Auth") with Entra ID in front of every HTTP request: a
// person signs in to the page (the browser is sent to Entra ID), and the CLI brings a bearer token
// for the API. Only people with the app role reach the app at all (the app registration requires
// an assignment); the consumer checks the token and its SeBridge.Decide role again itself. The
// Event Hubs trigger and the timer are not HTTP and are not affected. The token store keeps the
// signed-in person's token for the page, which reads it from the X-MS-TOKEN-AAD-ID-TOKEN header.
resource auth 'Microsoft.Web/sites/config@2025-03-01' = if (!empty(peopleClientId)) {
  // checkov reads this authentication resource as a web config, under a condition it does not
  // look into; it is App Service Authentication itself, and none of the web config checks apply:
  // checkov:skip=CKV_AZURE_13:This resource is App Service Authentication (Entra ID, authentication required).
  // checkov:skip=CKV_AZURE_66:Failed request tracing is a site setting, not an authentication one; the functions log to Application Insights.
  // checkov:skip=CKV_AZURE_63:HTTP logging is a site setting, not an authentication one; the functions log to Application Insights.
  // checkov:skip=CKV_AZURE_65:Detailed error pages are a site setting, not an authentication one.
  // checkov:skip=CKV_AZURE_222:Public network access is a site property; see the site above.
  // checkov:skip=CKV_AZURE_80:A Python app: no .NET Framework.
  // checkov:skip=CKV_AZURE_88:Azure Files is not used: Flex Consumption deploys from blob storage and shared keys are off.
  parent: app
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: peopleClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${peopleTenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${peopleClientId}'
            peopleClientId
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: true
      }
    }
    httpSettings: {
      requireHttps: true
    }
  }
}

// Diagnostic settings stay on 2021-05-01-preview, the newest version: the only GA one (2016-09-01)
// has no categoryGroup or metric category, and wants a location, a metric timeGrain and the name 'service'.
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: app
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        category: 'FunctionAppLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output appName string = app.name
output identityPrincipalId string = identity.properties.principalId
output identityClientId string = identity.properties.clientId
output insightsName string = insights.name
