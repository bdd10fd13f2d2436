<#
.SYNOPSIS
Install the se-bridge agent on a Windows VM as a service.

.DESCRIPTION
Creates a venv in %ProgramFiles%\se-bridge\venv, installs the agent's dependencies from the lock
(packaging\requirements\agent.txt, exported from uv.lock, each checked against its sha256) and
the agent itself without dependencies, from a wheel (only when its sha256 is the one the
release's SHA256SUMS beside it, or -Sums FILE, lists) or from an index by its exact version and
sha256 (-PipSpec se-bridge==X.Y.Z -PipHash sha256:HEX), writes
C:\ProgramData\se-bridge\agent.toml (Event Hubs and Log Analytics sinks, the VM's Storage Queue
for signed approvals; or, with -Trial, a local JSONL file as the only sink and no approvals),
then runs `se-bridge service install` and `se-bridge service start`.
Run from an elevated PowerShell after infra/main.bicep and infra/onboarding/vm.bicep.

C:\ProgramData\se-bridge, and anything in it, ends up owned by Administrators and open to SYSTEM
and Administrators only, whoever created it before the install.

.EXAMPLE
.\install-agent.ps1 -Wheel .\se_bridge-0.1.0-py3-none-any.whl `
  -EventHubsNamespace ns.servicebus.windows.net -LogsEndpoint https://x.westeurope-1.ingest.monitor.azure.com `
  -DcrId dcr-0123456789abcdef0123456789abcdef -StorageAccount sebridgeabc123 -VerifyKey BASE64

.EXAMPLE
.\install-agent.ps1 -Wheel .\se_bridge-0.1.0-py3-none-any.whl -Trial
#>
[CmdletBinding(DefaultParameterSetName = 'Wheel')]
param(
    [Parameter(Mandatory, ParameterSetName = 'Wheel')][string]$Wheel,
    [Parameter(ParameterSetName = 'Wheel')][string]$Sums,
    [Parameter(Mandatory, ParameterSetName = 'PipSpec')][ValidatePattern('^se-bridge==[0-9][0-9A-Za-z.+!-]*$')][string]$PipSpec,
    [Parameter(Mandatory, ParameterSetName = 'PipSpec')][ValidatePattern('^sha256:[0-9a-f]{64}$')][string[]]$PipHash,
    [switch]$Trial,
    [ValidatePattern('^[A-Za-z0-9][A-Za-z0-9.-]+$')][string]$EventHubsNamespace,
    [ValidatePattern('^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$')][string]$EventHub = 'records',
    [ValidatePattern('^https://[A-Za-z0-9.-]+(:[0-9]+)?/?$')][string]$LogsEndpoint,
    [ValidatePattern('^dcr-[0-9a-f]{32}$')][string]$DcrId,
    [ValidatePattern('^Custom-[A-Za-z0-9_]+$')][string]$Stream = 'Custom-SeBridgeRecords',
    [ValidatePattern('^[a-z0-9]{3,24}$')][string]$StorageAccount,
    [ValidatePattern('^[a-z0-9-]{0,40}$')][string]$QueuePrefix = 'se-bridge-',
    # Several while keys rotate (docs/signed-commands.md): the agent trusts each.
    [ValidatePattern('^[A-Za-z0-9+/]{43}=$')][string[]]$VerifyKey,
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

# Only SYSTEM (the service) and Administrators may read or change the configuration, by
# well-known SID: the same on a Windows of any language. Protected: nothing is inherited.
function New-AdminOnlyAcl {
    param([switch]$Directory)
    if ($Directory) {
        $acl = New-Object System.Security.AccessControl.DirectorySecurity
        $inherit = [System.Security.AccessControl.InheritanceFlags]'ContainerInherit, ObjectInherit'
    } else {
        $acl = New-Object System.Security.AccessControl.FileSecurity
        $inherit = [System.Security.AccessControl.InheritanceFlags]::None
    }
    $acl.SetAccessRuleProtection($true, $false)
    foreach ($sid in @('S-1-5-18', 'S-1-5-32-544')) {
        $who = New-Object System.Security.Principal.SecurityIdentifier $sid
        $acl.AddAccessRule((New-Object System.Security.AccessControl.FileSystemAccessRule($who, 'FullControl', $inherit, 'None', 'Allow')))
    }
    return $acl
}

# Every value is checked before anything changes.
$azure = @('EventHubsNamespace', 'EventHub', 'LogsEndpoint', 'DcrId', 'Stream', 'StorageAccount', 'QueuePrefix', 'VerifyKey', 'ClientId')
if ($Trial) {
    $given = @($azure | Where-Object { $PSBoundParameters.ContainsKey($_) })
    if ($given) { throw "-Trial writes local sinks only: leave out -$($given[0]) (or -Trial)" }
} else {
    foreach ($required in @('EventHubsNamespace', 'LogsEndpoint', 'DcrId', 'StorageAccount', 'VerifyKey')) {
        if (-not $PSBoundParameters.ContainsKey($required)) { throw "-$required is required (or -Trial, for local sinks only)" }
    }
}
if (-not (Test-Path -LiteralPath $Requirements -PathType Leaf)) {
    throw "-Requirements ${Requirements}: no such file (the lock's agent export)"
}
if ($PSCmdlet.ParameterSetName -eq 'Wheel') {
    # The wheel is the release's only if the release's SHA256SUMS lists its sha256.
    if (-not $Sums) { $Sums = Join-Path (Split-Path -Parent $Wheel) 'SHA256SUMS' }
    if (-not (Test-Path -LiteralPath $Sums -PathType Leaf)) {
        throw "-Wheel ${Wheel}: no SHA256SUMS beside it (or give -Sums FILE): a wheel is installed only when its sha256 is the one its release lists"
    }
    $name = Split-Path -Leaf $Wheel
    $want = Get-Content -LiteralPath $Sums | ForEach-Object {
        $hash, $file = $_ -split '\s+\*?', 2
        if ($file -eq $name) { $hash }
    } | Select-Object -First 1
    if ($want -notmatch '^[0-9a-f]{64}$') { throw "$Sums lists no sha256 for $name" }
    $got = (Get-FileHash -LiteralPath $Wheel -Algorithm SHA256).Hash.ToLowerInvariant()
    if ($got -ne $want) {
        throw "-Wheel ${Wheel}: its sha256 $got is not the $want that $Sums lists: it is not the release's file; nothing installed"
    }
}
# The venv's pip reads the locked requirements in hash-checking mode, which an older Python's
# cannot do. 'py' is the launcher: -3 picks the newest Python 3 it knows.
$pythonArgs = @()
if ($Python -eq 'py') { $pythonArgs = @('-3') }
if (-not (Get-Command $Python -ErrorAction SilentlyContinue)) {
    throw "$Python is not on PATH: the agent needs Python 3.10 or newer (install it, or give -Python PATH)"
}
$found = & $Python @pythonArgs -c 'import sys; print(sys.version.split()[0]); sys.exit(sys.version_info < (3, 10))'
if ($LASTEXITCODE -ne 0) {
    throw "$Python is Python ${found}: the agent needs Python 3.10 or newer (install one, then give -Python PATH)"
}

$venv = Join-Path $InstallDir 'venv'
$seBridge = Join-Path $venv 'Scripts\se-bridge.exe'
$config = Join-Path $ConfigDir 'agent.toml'

Write-Host "installing the agent into $venv"
Invoke-Checked $Python ($pythonArgs + @('-m', 'venv', $venv))
$venvPython = Join-Path $venv 'Scripts\python.exe'
# The venv's own pip: an upgrade from an index would be the one package installed unchecked.
Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--require-hashes', '--only-binary', ':all:', '-r', $Requirements)
if ($PSCmdlet.ParameterSetName -eq 'Wheel') {
    Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-deps', $Wheel)
} else {
    # From an index, only the release's own file (its sha256 from SHA256SUMS).
    $pinned = New-TemporaryFile
    try {
        Set-Content -LiteralPath $pinned.FullName -Encoding ascii -Value ((@($PipSpec) + @($PipHash | ForEach-Object { "--hash=$_" })) -join ' ')
        Invoke-Checked $venvPython @('-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--require-hashes', '--only-binary', ':all:', '--no-deps', '-r', $pinned.FullName)
    } finally {
        Remove-Item -LiteralPath $pinned.FullName -Force
    }
}
Invoke-Checked $seBridge @('--version')

# Every value was checked by its ValidatePattern: none can hold a quote or a backslash.
$identityLines = 'kind = "managed"'
if ($ClientId) { $identityLines += "`nclient_id = `"$ClientId`"" }
$verifyKeys = $VerifyKey -join ','

$trialToml = @"
# Written by infra/onboarding/install-agent.ps1 -Trial; see docs/configuration.md.
# A trial: records go to a local file only (records.jsonl in the state directory,
# C:\ProgramData\se-bridge), and no approvals are read. Run the script again without -Trial
# to ship to Event Hubs and Log Analytics.
[agent]
"@

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
verify_key = "$verifyKeys"
"@
if ($Trial) { $toml = $trialToml }

# Any user may create a folder in %ProgramData% and would own it, and what it holds: a folder
# or agent.toml made before the install must not stay theirs (they could change the agent's
# hooks, which run as SYSTEM). Administrators take ownership of the folder (takeown enables the
# privilege this needs) and replace its ACL in one step, so that from then on no one else can
# add to it; then they take everything inside too, whose own grants go (it inherits the
# folder's). agent.toml is written anew, never into a file someone else made (a hard link).
New-Item -ItemType Directory -Force -Path $ConfigDir | Out-Null
Invoke-Checked 'takeown.exe' @('/F', $ConfigDir, '/A') | Out-Null
Set-Acl -LiteralPath $ConfigDir -AclObject (New-AdminOnlyAcl -Directory)
if (Get-ChildItem -LiteralPath $ConfigDir -Force) {
    Invoke-Checked 'takeown.exe' @('/F', $ConfigDir, '/A', '/R', '/D', 'Y') | Out-Null
    Invoke-Checked 'icacls.exe' @((Join-Path $ConfigDir '*'), '/reset', '/T', '/C', '/Q') | Out-Null
}
if (Test-Path -LiteralPath $config) { Remove-Item -LiteralPath $config -Force }
# UTF-8 without a byte order mark: TOML readers refuse a BOM.
[System.IO.File]::WriteAllText($config, $toml.Replace("`r`n", "`n"), (New-Object System.Text.UTF8Encoding $false))
Set-Acl -LiteralPath $config -AclObject (New-AdminOnlyAcl)
Write-Host "wrote $config"
if ($Trial) {
    Write-Host "a trial: records go to $(Join-Path $env:ProgramData 'se-bridge\records.jsonl') only, and no approvals are read"
}

Invoke-Checked $seBridge @('service', 'install', '--config', $config)
if (-not $NoStart) {
    Invoke-Checked $seBridge @('service', 'start')
    Write-Host "the se-bridge service is installed and started; check it with: & '$seBridge' check --config '$config'"
} else {
    Write-Host "the se-bridge service is installed (not started: -NoStart)"
}
