"""Per-VM queues spread over several storage accounts (commands.queue_accounts, issue 15):
the consumer sends each command to the account the VM was set up with."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from bridge import channels
from bridge.channels.storagequeue import queue_account, queue_accounts
from bridge.cloud import identity
from bridge.commands.message import approve
from bridge.config import CommandsSettings, Config, StorageSettings
from bridge.retry import PermanentError

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("vm_id", "count", "index"),
    [
        # docs/deploying.md's shell rule: $(( 0x${VMID:0:8} % count ))
        ("00000005-0000-4000-8000-000000000000", 3, 2),
        ("FFFFFFFF-0000-4000-8000-000000000000", 3, 0),  # 4294967295 = 3 x 1431655765
        ("0000000a-9c2e-4000-8000-000000000000", 4, 2),
        ("1b1f0000-0000-4000-8000-000000000000", 1, 0),
    ],
)
def test_a_vm_takes_the_account_at_its_first_8_hex_digits_modulo_the_count(
    vm_id: str, count: int, index: int
) -> None:
    accounts = [f"acct{n}" for n in range(count)]
    assert queue_account(vm_id, accounts) == f"acct{index}"


def config(accounts: str, **storage: str) -> Config:
    return Config(
        storage=StorageSettings(**(storage or {"account": "main"})),
        commands=CommandsSettings(queue_accounts=accounts),
    )


@pytest.mark.parametrize(
    ("accounts", "storage", "says"),
    [
        ("acct0,Acct1", {}, "'Acct1' is not a storage account name"),
        ("acct0,,acct1", {}, "'' is not a storage account name"),
        ("acct0, acct0", {}, "names an account twice"),
        ("acct0,acct1", {"connection_string": "UseDevelopmentStorage=true"}, "needs Entra ID"),
    ],
)
def test_unusable_queue_accounts_stop_the_consumer_naming_the_setting(
    accounts: str, storage: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=r"commands\.queue_accounts") as refused:
        channels.sender("storagequeue", config(accounts, **storage))
    assert says in str(refused.value)


def test_no_queue_accounts_means_the_storage_account() -> None:
    assert queue_accounts("", StorageSettings(account="main")) == []
    assert queue_accounts(" acct0 ,acct1", StorageSettings(account="main")) == ["acct0", "acct1"]


class _Refused:
    """Entra ID refusing every token: the send fails before any request leaves, naming the
    endpoint it was for."""

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        raise ClientAuthenticationError("no token here")


def test_each_command_goes_to_its_vms_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "credential", lambda settings: _Refused())
    sender = channels.sender("storagequeue", config("acct0,acct1,acct2"))
    try:
        for vm_id, account in (
            ("00000005-0000-4000-8000-000000000000", "acct2"),
            ("00000006-0000-4000-8000-000000000000", "acct0"),
            ("00000007-0000-4000-8000-000000000000", "acct1"),
        ):
            command = approve(
                vm_id=vm_id, event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                document_incarnation=3, issued_at=NOW, expires_at=NOW + timedelta(minutes=2),
                rule="all", reason="test", resources=[],
            )  # fmt: skip
            with pytest.raises(PermanentError) as failed:
                sender.send(command, 60)
            assert f"https://{account}.queue.core.windows.net" in str(failed.value)
    finally:
        sender.close()
