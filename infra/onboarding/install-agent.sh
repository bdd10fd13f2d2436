#!/usr/bin/env bash
# Install the se-bridge agent on a Linux VM: a venv in /opt/se-bridge/venv, the configuration
# in /etc/se-bridge/agent.toml (Event Hubs and Log Analytics sinks, the VM's Storage Queue for
# signed approvals), and the systemd unit, enabled and started. Run as root after
# infra/main.bicep and infra/onboarding/vm.bicep (docs/deploying.md, "Deploying to Azure").
#
#   sudo ./install-agent.sh --wheel se_bridge-X.Y.Z-py3-none-any.whl \
#     --eventhubs-namespace NS.servicebus.windows.net --logs-endpoint https://...ingest.monitor.azure.com \
#     --dcr-id dcr-... --storage-account NAME --verify-key BASE64 [--verify-key BASE64]
#
# The agent's dependencies come from the lock (packaging/requirements/agent.txt, exported from
# uv.lock), each checked against its sha256; the package itself is installed without
# dependencies, from the wheel given or from an index by its exact version and sha256
# (--pip-spec se-bridge==X.Y.Z --pip-hash sha256:HEX). --requirements FILE names another
# export (a mirror's, say).
#
# A wheel is installed only when its sha256 is the one the release's SHA256SUMS lists (the file
# beside the wheel, or --sums FILE); --attested-by OWNER/REPO first has gh check that the
# release workflow of that repository signed SHA256SUMS (its build provenance attestation).
#
# --trial writes a configuration with a local JSONL file as the only sink and no approvals:
# no Azure value is needed (and none is taken).
#
# --root DIR installs into DIR instead of / (for packaging and tests): no user is created and
# the host's systemd is never called. The tree is built for where it will live: the venv's
# scripts and compiled files name /opt/se-bridge/venv, not DIR, so they run once DIR is /.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: install-agent.sh (--wheel FILE [--sums SHA256SUMS] [--attested-by OWNER/REPO]
          | --pip-spec se-bridge==X.Y.Z --pip-hash sha256:HEX)
         (--eventhubs-namespace FQDN --logs-endpoint URL --dcr-id dcr-...
          --storage-account NAME --verify-key BASE64 [--verify-key BASE64]
          [--eventhub NAME] [--stream NAME] [--queue-prefix PREFIX] [--client-id GUID]
          | --trial)
         [--requirements FILE] [--unit-file FILE] [--python PYTHON] [--root DIR] [--no-start]
USAGE
}

die() {
  echo "install-agent.sh: $*" >&2
  exit 2
}

wheel="" sums="" attested_by="" pip_spec="" pip_hashes=() namespace="" eventhub="records" endpoint="" dcr_id=""
account="" verify_keys=() stream="Custom-SeBridgeRecords" queue_prefix="se-bridge-" client_id=""
python="python3" root="" start=1 trial=0 azure_options=()
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
unit_file="$repo/packaging/systemd/se-bridge-agent.service"
requirements="$repo/packaging/requirements/agent.txt"

while (($#)); do
  case $1 in
    --wheel) wheel=${2:?}; shift 2 ;;
    --sums) sums=${2:?}; shift 2 ;;
    --attested-by) attested_by=${2:?}; shift 2 ;;
    --pip-spec) pip_spec=${2:?}; shift 2 ;;
    --pip-hash) pip_hashes+=("${2:?}"); shift 2 ;;
    --trial) trial=1; shift ;;
    --eventhubs-namespace | --eventhub | --logs-endpoint | --dcr-id | --stream | \
      --storage-account | --queue-prefix | --verify-key | --client-id)
      azure_options+=("$1")
      case $1 in
        --eventhubs-namespace) namespace=${2:?} ;;
        --eventhub) eventhub=${2:?} ;;
        --logs-endpoint) endpoint=${2:?} ;;
        --dcr-id) dcr_id=${2:?} ;;
        --stream) stream=${2:?} ;;
        --storage-account) account=${2:?} ;;
        --queue-prefix) queue_prefix=${2?} ;;
        # Given more than once while keys rotate (docs/signed-commands.md): the agent trusts each.
        --verify-key) verify_keys+=("${2:?}") ;;
        --client-id) client_id=${2:?} ;;
      esac
      shift 2 ;;
    --unit-file) unit_file=${2:?}; shift 2 ;;
    --requirements) requirements=${2:?}; shift 2 ;;
    --python) python=${2:?}; shift 2 ;;
    --root) root=${2:?}; shift 2 ;;
    --no-start) start=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done

# Every value lands in a TOML string, so each is checked against what Azure allows; none can
# hold a quote or a backslash.
check() { # NAME VALUE REGEX HINT
  [[ $2 =~ $3 ]] || die "--$1 '$2' is not valid: $4"
}
[[ -n $wheel || -n $pip_spec ]] || die "give --wheel FILE or --pip-spec se-bridge==X.Y.Z"
[[ -z $wheel || -f $wheel ]] || die "--wheel $wheel: no such file"
if [[ -n $wheel ]]; then
  # The wheel is the release's only if SHA256SUMS says so; SHA256SUMS is the release's only if
  # its attestation says so (or the operator checked it against the release page).
  sums=${sums:-$(dirname "$wheel")/SHA256SUMS}
  [[ -f $sums ]] || die "--wheel $wheel: no SHA256SUMS beside it (or give --sums FILE): a wheel\
 is installed only when its sha256 is the one its release lists"
  if [[ -n $attested_by ]]; then
    check attested-by "$attested_by" '^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$' "OWNER/REPO on GitHub"
    command -v gh >/dev/null 2>&1 || die "--attested-by needs the GitHub CLI (gh) on PATH"
    gh attestation verify "$sums" --repo "$attested_by" >&2 ||
      die "$sums: no attestation of $attested_by's release workflow signs it: install nothing"
  fi
  name=$(basename "$wheel")
  want=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1; exit }' "$sums")
  [[ $want =~ ^[0-9a-f]{64}$ ]] || die "$sums lists no sha256 for $name"
  got=$(sha256sum "$wheel" | cut -d' ' -f1)
  [[ $got == "$want" ]] || die "--wheel $wheel: its sha256 $got is not the $want that $sums\
 lists: it is not the release's file; nothing installed"
fi
if [[ -n $pip_spec ]]; then
  # From an index, only the release's own file: anything else could be whatever the index (or
  # someone who took the name there) serves.
  check pip-spec "$pip_spec" '^se-bridge==[0-9][0-9A-Za-z.+!-]*$' \
    "an exact version, se-bridge==X.Y.Z, installed only with its --pip-hash"
  ((${#pip_hashes[@]})) || die "--pip-spec $pip_spec needs --pip-hash sha256:HEX, the sha256 of\
 the release's wheel (its SHA256SUMS): se-bridge is never installed from an index unchecked"
  for hash in "${pip_hashes[@]}"; do
    check pip-hash "$hash" '^sha256:[0-9a-f]{64}$' "sha256: and the 64 hex digits of the wheel's sha256"
  done
fi
if ((trial)); then
  ((${#azure_options[@]} == 0)) ||
    die "--trial writes local sinks only: leave out ${azure_options[0]} (or --trial)"
else
  # A value never given is missing, not invalid: name every one at once.
  missing=()
  [[ -n $namespace ]] || missing+=(--eventhubs-namespace)
  [[ -n $endpoint ]] || missing+=(--logs-endpoint)
  [[ -n $dcr_id ]] || missing+=(--dcr-id)
  [[ -n $account ]] || missing+=(--storage-account)
  ((${#verify_keys[@]})) || missing+=(--verify-key)
  if ((${#missing[@]})); then
    die "missing $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g'): the Azure values, from\
 infra/main.bicep's outputs and se-bridge keygen (docs/getting-started.md, step 2); or give --trial\
 to try the agent with a local file as its only sink"
  fi
  check eventhubs-namespace "$namespace" '^[A-Za-z0-9][A-Za-z0-9.-]+$' \
    "the host name only, such as contoso.servicebus.windows.net"
  check eventhub "$eventhub" '^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$' "an event hub name"
  check logs-endpoint "$endpoint" '^https://[A-Za-z0-9.-]+(:[0-9]+)?/?$' \
    "the https:// logs ingestion endpoint (main.bicep output logsIngestionEndpoint)"
  check dcr-id "$dcr_id" '^dcr-[0-9a-f]{32}$' \
    "the rule's immutable id dcr-... (output dataCollectionRuleImmutableId)"
  check stream "$stream" '^Custom-[A-Za-z0-9_]+$' "a DCR stream name such as Custom-SeBridgeRecords"
  check storage-account "$account" '^[a-z0-9]{3,24}$' "3-24 lowercase letters and digits"
  check queue-prefix "$queue_prefix" '^[a-z0-9-]{0,40}$' "lowercase letters, digits and hyphens"
  for key in "${verify_keys[@]}"; do
    check verify-key "$key" '^[A-Za-z0-9+/]{43}=$' \
      "base64 of the 32-byte Ed25519 public key, as se-bridge keygen prints it"
  done
  if [[ -n $client_id ]]; then
    check client-id "$client_id" '^[0-9a-fA-F-]{36}$' "a user-assigned identity's client id (a GUID)"
  fi
fi
[[ -f $unit_file ]] || die "--unit-file $unit_file: no such file"
[[ -f $requirements ]] || die "--requirements $requirements: no such file (the lock's agent export)"

# The venv's pip reads the locked requirements in hash-checking mode, which an older Python's
# pip or one without venv (Debian's python3 before python3-venv) cannot do.
command -v "$python" >/dev/null 2>&1 ||
  die "$python is not on PATH: the agent needs Python 3.10 or newer (give --python PATH)"
found=$("$python" -c 'import sys; print(sys.version.split()[0]); sys.exit(sys.version_info < (3, 10))' 2>&1) ||
  die "$python is Python ${found:-of an unknown version}: the agent needs Python 3.10 or newer\
 (install one, then give --python PATH)"
"$python" -c 'import ensurepip, venv' >/dev/null 2>&1 ||
  die "$python has no venv module: install it (python3-venv on Debian and Ubuntu)"

final_venv="/opt/se-bridge/venv" # where the venv lives once $root is /
venv="$root$final_venv"
config_dir="$root/etc/se-bridge"
config="$config_dir/agent.toml"
unit_dir="$root/etc/systemd/system"

if [[ -z $root ]] && ! id se-bridge >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin se-bridge
fi

echo "installing the agent into $venv"
"$python" -m venv "$venv"
# -I: neither PYTHONPATH nor the current directory (a checkout, with its se_bridge.egg-info)
# may make pip think a package is installed already.
pip=("$venv/bin/python" -I -m pip install --quiet --no-compile)
"${pip[@]}" --require-hashes --only-binary :all: -r "$requirements"
if [[ -n $wheel ]]; then
  "${pip[@]}" --no-deps "$wheel"
else
  pinned="$(mktemp)"
  trap 'rm -f "$pinned"' EXIT
  printf '%s' "$pip_spec" >"$pinned"
  printf ' --hash=%s' "${pip_hashes[@]}" >>"$pinned"
  echo >>"$pinned"
  "${pip[@]}" --require-hashes --only-binary :all: --no-deps -r "$pinned"
fi
"$venv/bin/se-bridge" --version
if [[ -n $root ]]; then
  # Built under $root, the venv names $venv in its scripts' shebangs, its activate scripts and
  # pyvenv.cfg: each would point into $root once $root is /. They name $final_venv instead
  # (after this, run the venv here as "$venv/bin/python -m bridge", not by its scripts).
  "$venv/bin/python" -I - "$venv" "$final_venv" <<'PY'
import sys
from pathlib import Path

staged, final = sys.argv[1].encode(), sys.argv[2].encode()
venv = Path(sys.argv[1])
for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
    if path.is_file() and not path.is_symlink():
        text = path.read_bytes()
        if staged in text:
            path.write_bytes(text.replace(staged, final))
PY
fi
# Compiled once here, as root: the agent's user cannot write the venv. Each file's recorded
# source path is where it will live (tracebacks name it), not under $root. A file that does
# not compile is left to be compiled when imported, as pip leaves it.
relocate=()
[[ -z $root ]] || relocate=(-s "$root" -p /)
"$venv/bin/python" -I -m compileall -q -f "${relocate[@]}" "$venv/lib" ||
  echo "install-agent.sh: the files above did not compile; Python compiles them when imported" >&2

mkdir -p "$config_dir"
umask 027
tmp="$(mktemp "$config_dir/.agent.toml.XXXXXX")"
if ((trial)); then
  cat >"$tmp" <<'TOML'
# Written by infra/onboarding/install-agent.sh --trial; see docs/configuration.md.
# A trial: records go to a local file only (records.jsonl in the state directory,
# /var/lib/se-bridge), and no approvals are read. Run the script again without --trial
# to ship to Event Hubs and Log Analytics.
[agent]
TOML
else
  identity_lines='kind = "managed"'
  if [[ -n $client_id ]]; then
    identity_lines+=$'\n'"client_id = \"$client_id\""
  fi
  verify_key=$(IFS=,; echo "${verify_keys[*]}")
  cat >"$tmp" <<TOML
# Written by infra/onboarding/install-agent.sh; see docs/configuration.md.
[agent]
sinks = ["eventhubs", "loganalytics"]

[eventhubs]
namespace = "$namespace"
name = "$eventhub"

[loganalytics]
endpoint = "$endpoint"
rule_id = "$dcr_id"
stream = "$stream"

[identity]
$identity_lines

[storage]
account = "$account"

[commands]
channel = "storagequeue"
queue_prefix = "$queue_prefix"
verify_key = "$verify_key"
TOML
fi
if [[ -z $root ]]; then
  chown root:se-bridge "$tmp"
fi
chmod 0640 "$tmp"
mv -f "$tmp" "$config"
echo "wrote $config"

mkdir -p "$unit_dir"
install -m 0644 "$unit_file" "$unit_dir/se-bridge-agent.service"
echo "installed $unit_dir/se-bridge-agent.service"

if ((trial)); then
  echo "a trial: records go to /var/lib/se-bridge/records.jsonl only, and no approvals are read"
fi
# The venv is not on PATH, and sudo's secure_path would drop it: the hint names the full path.
hint="check it with: /opt/se-bridge/venv/bin/se-bridge check --config /etc/se-bridge/agent.toml"
if [[ -n $root ]]; then
  echo "not starting the service (--root): the host's systemd is left alone; once $root is /, $hint"
elif ((start)) && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  systemctl enable --now se-bridge-agent.service
  echo "se-bridge-agent.service enabled and started; $hint"
else
  echo "not starting the service (--no-start, or no systemctl); $hint"
fi
