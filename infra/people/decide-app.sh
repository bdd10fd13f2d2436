#!/usr/bin/env bash
# Creates or updates the Entra ID app registration people sign in to for se-bridge's approval
# page and API: the app role SeBridge.Decide (app-roles.json), the Application ID URI
# api://<client id>, a delegated scope the Azure CLI and Azure PowerShell may use without a
# consent prompt (so `se-bridge approve` gets a token with the person's own `az login`), the
# sign-in redirect of each Function App, and an enterprise application that lets in only the
# people given the role.
# Safe to run again: it finds the registration by its display name and changes only what differs.
#
#   infra/people/decide-app.sh [--name NAME] [--host HOST]... [--assign OBJECT_ID]...
#     --name    display name of the app registration (default se-bridge-approvals)
#     --host    a Function App's host name (NAME.azurewebsites.net); give every one, each run
#     --assign  object id of a user or group who gets SeBridge.Decide (repeatable)
#
# It prints the client id to deploy with: az deployment group create ... -p peopleClientId=ID.
# Needs an `az login` that may create app registrations (Application Developer) and, for
# --assign, assign their roles (Cloud Application Administrator, or owner of the app).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
name=se-bridge-approvals
hosts=()
assignees=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --host) hosts+=("$2"); shift 2 ;;
    --assign) assignees+=("$2"); shift 2 ;;
    *) echo "decide-app.sh: unknown argument $1 (see the comment at the top of this script)" >&2; exit 2 ;;
  esac
done

app_id=$(az ad app list --display-name "$name" --query "[0].appId" -o tsv)
if [ -z "$app_id" ]; then
  app_id=$(az ad app create --display-name "$name" --sign-in-audience AzureADMyOrg \
    --app-roles "@$here/app-roles.json" --enable-id-token-issuance true --query appId -o tsv)
  echo "created app registration $name ($app_id)" >&2
else
  az ad app update --id "$app_id" --app-roles "@$here/app-roles.json" --enable-id-token-issuance true -o none
  echo "updated app registration $name ($app_id)" >&2
fi

redirects=()
for host in "${hosts[@]}"; do
  redirects+=("https://$host/.auth/login/aad/callback")
done
if [ ${#redirects[@]} -gt 0 ]; then
  az ad app update --id "$app_id" --identifier-uris "api://$app_id" --web-redirect-uris "${redirects[@]}" -o none
else
  az ad app update --id "$app_id" --identifier-uris "api://$app_id" -o none
fi

# The scope must exist before an application can be pre-authorised for it: two requests.
graph=$(az cloud show --query endpoints.microsoftGraphResourceId -o tsv)
graph=${graph%/}
object_id=$(az ad app show --id "$app_id" --query id -o tsv)
for body in api-scope.json api-preauthorized.json; do
  az rest --method PATCH --uri "$graph/v1.0/applications/$object_id" \
    --headers Content-Type=application/json --body "@$here/$body" -o none
done

sp_id=$(az ad sp list --filter "appId eq '$app_id'" --query "[0].id" -o tsv)
if [ -z "$sp_id" ]; then
  sp_id=$(az ad sp create --id "$app_id" --query id -o tsv)
fi
# Only people (or groups) given the role may sign in at all; the consumer checks the role again.
az ad sp update --id "$sp_id" --set appRoleAssignmentRequired=true -o none

role_id=$(az ad app show --id "$app_id" --query "appRoles[?value=='SeBridge.Decide'].id | [0]" -o tsv)
for principal in "${assignees[@]}"; do
  held=$(az rest --method GET --uri "$graph/v1.0/servicePrincipals/$sp_id/appRoleAssignedTo?\$top=999" \
    --query "length(value[?principalId=='$principal' && appRoleId=='$role_id'])" -o tsv)
  if [ "$held" = "0" ]; then
    az rest --method POST --uri "$graph/v1.0/servicePrincipals/$sp_id/appRoleAssignedTo" \
      --headers Content-Type=application/json \
      --body "{\"principalId\": \"$principal\", \"resourceId\": \"$sp_id\", \"appRoleId\": \"$role_id\"}" -o none
    echo "gave SeBridge.Decide to $principal" >&2
  fi
done

echo "peopleClientId=$app_id"
