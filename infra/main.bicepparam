// An example parameters file for main.bicep (az deployment group create -g RG -p main.bicepparam).
// Copy it beside main.bicep, set what differs, and leave the rest to main.bicep's defaults.
// The signing key is read from the environment, never written here:
//   SE_BRIDGE_SIGNING_KEY_PEM="$(cat signing.pem)" az deployment group create -g rg-se-bridge \
//     -p infra/main.bicepparam
using './main.bicep'

param prefix = 'sebridge'
param eventHubPartitionCount = 4
// A large fleet shards (docs/deploying.md, "Parameters of infra/main.bicep"): each VM uses the
// namespace, rule and queue account at index (first 8 hex digits of its VmId) mod the count.
param eventHubNamespaceCount = 1
param ingestionRuleCount = 1
param queueAccountCount = 1
param retentionInDays = 90
param consumerPolicy = ''
param consumerCreatesQueues = true
param keyVaultPublicNetworkAccess = 'Enabled'
param deployAlerts = true
param signingKeyPem = readEnvironmentVariable('SE_BRIDGE_SIGNING_KEY_PEM')
// People in the loop (docs/people.md): the client id infra/people/decide-app.sh prints turns on
// the approval page behind Entra ID sign-in; the webhook URL is a secret, read from the
// environment into the Key Vault (empty: no notifications).
param peopleClientId = ''
param notifyWebhookUrl = readEnvironmentVariable('SE_BRIDGE_NOTIFY_WEBHOOK_URL', '')
param notifyTargetKind = 'generic'
