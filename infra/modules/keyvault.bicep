// The Key Vault holding the consumer's Ed25519 command-signing key (PEM), read by the Function
// App through SE_BRIDGE_COMMANDS_SIGNING_KEY = keyvault:https://VAULT.vault.azure.net/secrets/NAME.
// RBAC mode: the consumer's identity gets Key Vault Secrets User on this one secret only.
// Optionally it also holds the URL of the webhook the consumer notifies people through
// ([notify]): a URL with its token is a secret, given as a secure parameter and never output.

@description('Key Vault name (3-24 characters, globally unique).')
@minLength(3)
@maxLength(24)
param vaultName string

param location string

@description('Enabled: reachable from the internet (Entra ID and RBAC guard it). Disabled needs a private endpoint and VNet integration of the Function App, which this template does not declare.')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Name of the secret that holds the private key.')
param secretName string

@description('The Ed25519 private key, PEM (PKCS#8), from `se-bridge keygen`.')
@secure()
param signingKeyPem string

@description('Name of the secret that holds the notification webhook\'s URL.')
param webhookSecretName string = 'se-bridge-notify-webhook'

@description('The URL of the webhook the consumer notifies people through (a Teams workflow, Slack or a generic receiver); it carries its own token, so it is a secret. Empty: no secret.')
@secure()
param webhookUrl string = ''

param tags object = {}

@description('Log Analytics workspace that receives this resource\'s logs and metrics (diagnostic settings); empty: none.')
param diagnosticsWorkspaceId string = ''

resource vault 'Microsoft.KeyVault/vaults@2026-02-01' = {
  // checkov:skip=CKV_AZURE_109:Network access is a parameter; the Flex Consumption app has no VNet here, so the default allows public access with RBAC.
  // checkov:skip=CKV_AZURE_189:Same parameter (publicNetworkAccess); a private endpoint needs VNet integration not declared here.
  name: vaultName
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: publicNetworkAccess == 'Enabled' ? 'Allow' : 'Deny'
    }
  }
}

resource secret 'Microsoft.KeyVault/vaults/secrets@2026-02-01' = {
  // checkov:skip=CKV_AZURE_41:No expiry: an expired signing key would stop every approval; rotate with a new key pair (the KeyId in each command names it).
  parent: vault
  name: secretName
  properties: {
    value: signingKeyPem
    contentType: 'application/x-pem-file'
    attributes: {
      enabled: true
    }
  }
}

resource webhookSecret 'Microsoft.KeyVault/vaults/secrets@2026-02-01' = if (!empty(webhookUrl)) {
  // checkov:skip=CKV_AZURE_41:No expiry: the URL lasts until its owner rotates it in the chat tool; an expiry date here would silently stop notifications.
  // checkov:skip=CKV_AZURE_114:contentType is set (text/uri-list) below; checkov does not read the properties of a resource deployed under a condition.
  parent: vault
  name: webhookSecretName
  properties: {
    value: webhookUrl
    contentType: 'text/uri-list'
    attributes: {
      enabled: true
    }
  }
}

// Diagnostic settings stay on 2021-05-01-preview, the newest version: the only GA one (2016-09-01)
// has no categoryGroup or metric category, and wants a location, a metric timeGrain and the name 'service'.
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(diagnosticsWorkspaceId)) {
  name: 'se-bridge-logs'
  scope: vault
  properties: {
    workspaceId: diagnosticsWorkspaceId
    logs: [
      {
        categoryGroup: 'audit'
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

output vaultName string = vault.name
output vaultUri string = vault.properties.vaultUri
output secretName string = secret.name
output secretUri string = '${vault.properties.vaultUri}secrets/${secret.name}'
// The webhook secret's name, never its value; it names nothing when no webhookUrl was given
// (an output that so much as tests a secure parameter is what the linter refuses).
output webhookSecretName string = webhookSecretName
