<#
.SYNOPSIS
Install the se-bridge agent on a Windows VM as a service.

.DESCRIPTION
Creates a venv in %ProgramFiles%\se-bridge\venv, installs the agent's dependencies from the lock
(packaging\requirements\agent.txt, exported from uv.lock, each checked against its sha256) and
the agent itself from a wheel or a pip spec without dependencies,
writes C:\ProgramData\se-bridge\agent.toml (Event Hubs and Log Analytics sinks, the VM's Storage
Queue for signed approvals), then runs `se-bridge service install` and `se-bridge service start`.
Run from an elevated PowerShell after infra/main.bicep and infra/onboarding/vm.bicep.

.EXAMPLE
.\install-agent.ps1 -Wheel .\se_bridge-0.1.0-py3-none-any.whl `
  -EventHubsNamespace ns.servicebus.windows.net -LogsEndpoint https://x.westeurope-1.ingest.monitor.azure.com `
  -DcrId dcr-0123456789abcdef0123456789abcdef -StorageAccount sebridgeabc123 -VerifyKey BASE64
#>
[CmdletBinding(DefaultParameterSetName = 'Wheel')]
param(
    [Parameter(Mandatory, ParameterSetName = 'Wheel')][string]$Wheel,
    [Parameter(Mandatory, ParameterSetName = 'PipSpec')][string]$PipSpec,
    [Parameter(Mandatory)][ValidatePattern('^[A-Za-z0-9][A-Za-z0-9.-]+$')][string]$EventHubsNamespace,
    [ValidatePattern('^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$')][string]$EventHub = 'records',
    [Parameter(Mandatory)][ValidatePattern('^https://[A-Za-z0-9.-]+(:[0-9]+)?/?$')][string]$LogsEndpoint,
    [Parameter(Mandatory)][ValidatePattern('^dcr-[0-9a-f]{32}$')][string]$DcrId,
    [ValidatePattern('^Custom-[A-Za-z0-9_]+$')][string]$Stream = 'Custom-SeBridgeRecords',
    [Parameter(Mandatory)][ValidatePattern('^[a-z0-9]{3,24}$')][string]$StorageAccount,
    [ValidatePattern('^[a-z0-9-]{0,40}$')][string]$QueuePrefix = 'se-bridge-',
    [Parameter(Mandatory)][ValidatePattern('^[A-Za-z0-9+/]{43}=$')][string]$VerifyKey,
    [ValidatePattern('^([0-9a-fA-F-]{36})?$')][string]$ClientId = '',
    [string]$Requirements = (Join-Path $PSScriptRoot '..\..\packaging\requirements\agent.txt'),
    [string]$Python = 'py',
    [string]$InstallDir = (Join-Path $env:ProgramFiles 'se-bridge'),
    [string]$ConfigDir = (Join-Path $env:ProgramData 'se-bridge'),
    [switch]$NoStart
)

$ErrorActionPreference = 'Stop'
Set-StrictMode -Version Latest

function Invoke-Checked {
    param([string]$Exe, [string[]]$Arguments)
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Exe $($Arguments -join ' ') failed with exit code $LASTEXITCODE" }
}

$venv = Join-Path $InstallDir 'venv'
$seBridge = Join-Path $venv 'Scripts\se-bridge.exe'
$config = Join-Path $ConfigDir 'agent.toml'

Write-Host "installing the agent into $venv"
$pythonArgs = @()
if ($Python -eq 'py') { $pythonArgs = @('-3.11') }
Invoke-Checked $Python ($pythonArgs + @('-m', 'venv', $venv))
$venvPython = Join-Path $venv 'Scripts\python.exe'
Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--upgrade', 'pip')
if (-not (Test-Path -LiteralPath $Requirements -PathType Leaf)) {
    throw "-Requirements ${Requirements}: no such file (the lock's agent export)"
}
Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--require-hashes', '--only-binary', ':all:', '-r', $Requirements)
if ($PSCmdlet.ParameterSetName -eq 'Wheel') {
    Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--no-deps', $Wheel)
} else {
    Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--no-deps', $PipSpec)
}
Invoke-Checked $seBridge @('--version')

# Every value was checked by its ValidatePattern: none can hold a quote or a backslash.
$identityLines = 'kind = "managed"'
if ($ClientId) { $identityLines += "`nclient_id = `"$ClientId`"" }

$toml = @"
# Written by infra/onboarding/install-agent.ps1; see docs/configuration.md.
[agent]
sinks = ["eventhubs", "loganalytics"]

[eventhubs]
namespace = "$EventHubsNamespace"
name = "$EventHub"

[loganalytics]
endpoint = "$LogsEndpoint"
rule_id = "$DcrId"
stream = "$Stream"

[identity]
$identityLines

[storage]
account = "$StorageAccount"

[commands]
channel = "storagequeue"
queue_prefix = "$QueuePrefix"
verify_key = "$VerifyKey"
"@

New-Item -ItemType Directory -Force -Path $ConfigDir | Out-Null
# UTF-8 without a byte order mark: TOML readers refuse a BOM.
[System.IO.File]::WriteAllText($config, $toml.Replace("`r`n", "`n"), (New-Object System.Text.UTF8Encoding $false))
# Only SYSTEM (the service) and Administrators may read or change the configuration.
$acl = New-Object System.Security.AccessControl.FileSecurity
$acl.SetAccessRuleProtection($true, $false)
foreach ($who in @('NT AUTHORITY\SYSTEM', 'BUILTIN\Administrators')) {
    $rule = New-Object System.Security.AccessControl.FileSystemAccessRule($who, 'FullControl', 'Allow')
    $acl.AddAccessRule($rule)
}
Set-Acl -Path $config -AclObject $acl
Write-Host "wrote $config"

Invoke-Checked $seBridge @('service', 'install', '--config', $config)
if (-not $NoStart) {
    Invoke-Checked $seBridge @('service', 'start')
    Write-Host "the se-bridge service is installed and started; check it with: & '$seBridge' check --config '$config'"
} else {
    Write-Host "the se-bridge service is installed (not started: -NoStart)"
}
