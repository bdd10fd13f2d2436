"""Entra ID tokens against a tenant's JWKS served over real HTTP, and the local operator."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from bridge.consumer.people.auth import EntraVerifier, LocalOperator, Refused, read_token
from bridge.policy.model import Person
from tests.doubles.entra import AUDIENCE, ROLE, Tenant, serving


@pytest.fixture(scope="module")
def tenant() -> Iterator[Tenant]:
    with serving(Tenant()) as served:
        yield served


@pytest.fixture
def verifier(tenant: Tenant) -> EntraVerifier:
    return EntraVerifier(
        tenant.tenant_id, [AUDIENCE, "c1"], role=ROLE, jwks_url=tenant.jwks_url, timeout=2
    )


def refused(verifier: EntraVerifier, token: str) -> Refused:
    with pytest.raises(Refused) as caught:
        verifier.person(token)
    return caught.value


def test_a_good_token_is_the_person_it_names(tenant: Tenant, verifier: EntraVerifier) -> None:
    assert verifier.person(tenant.token(oid="o-1", name="Dana")) == Person("o-1", "Dana")


def test_a_v1_token_for_the_client_id_is_good_too(tenant: Tenant, verifier: EntraVerifier) -> None:
    token = tenant.token(audience="c1", issuer=f"https://sts.windows.net/{tenant.tenant_id}/")
    assert verifier.person(token).name == "Dana Operator"


def test_the_keys_are_fetched_once_for_many_tokens(tenant: Tenant) -> None:
    fresh = EntraVerifier(tenant.tenant_id, [AUDIENCE], jwks_url=tenant.jwks_url)
    before = tenant.fetches
    for n in range(5):
        fresh.person(tenant.token(oid=f"o-{n}"))
    assert tenant.fetches - before == 1


def test_an_expired_token_is_refused(tenant: Tenant, verifier: EntraVerifier) -> None:
    err = refused(verifier, tenant.token(age=7200, lifetime=3600))
    assert (err.status, "expired" in err.reason) == (401, True)


def test_a_token_for_another_audience_is_refused(tenant: Tenant, verifier: EntraVerifier) -> None:
    err = refused(verifier, tenant.token(audience="api://someone-else"))
    assert (err.status, "audience" in err.reason.lower()) == (401, True)


def test_a_token_of_another_issuer_is_refused(tenant: Tenant, verifier: EntraVerifier) -> None:
    other = "https://login.microsoftonline.com/99999999-0000-0000-0000-000000000000/v2.0"
    err = refused(verifier, tenant.token(issuer=other))
    assert (err.status, "issuer" in err.reason.lower()) == (401, True)


def test_a_person_without_the_role_is_forbidden(tenant: Tenant, verifier: EntraVerifier) -> None:
    err = refused(verifier, tenant.token(roles=("SeBridge.Read",), name="Eve"))
    assert err.status == 403
    assert "Eve does not have the app role SeBridge.Decide" in err.reason
    assert refused(verifier, tenant.token(roles=())).status == 403


def test_a_tampered_token_is_refused(tenant: Tenant, verifier: EntraVerifier) -> None:
    header, _, signature = tenant.token(roles=()).split(".")
    _, granted, _ = tenant.token(roles=(ROLE,)).split(".")
    err = refused(verifier, f"{header}.{granted}.{signature}")
    assert (err.status, "signature" in err.reason.lower()) == (401, True)


def test_a_token_signed_by_an_unknown_key_is_refused(
    tenant: Tenant, verifier: EntraVerifier
) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(verifier, tenant.token(kid="k9", key=stranger)).status == 401
    # The right kid with another key: the signature is checked, not only the kid.
    assert refused(verifier, tenant.token(key=stranger)).status == 401


def test_no_token_at_all_is_refused(verifier: EntraVerifier) -> None:
    assert refused(verifier, "not-a-jwt").status == 401


def test_unreachable_keys_are_a_503_not_a_refusal(tenant: Tenant) -> None:
    nowhere = EntraVerifier(tenant.tenant_id, [AUDIENCE], jwks_url="http://127.0.0.1:9/k")
    assert refused(nowhere, tenant.token()).status == 503


def test_the_local_operator_token_file_is_private(tmp_path: Path) -> None:
    operator = LocalOperator.start(tmp_path)
    assert stat.S_IMODE((tmp_path / "operator-token").stat().st_mode) == 0o600
    assert operator.bearer(read_token(tmp_path)).object_id.startswith("local:")
    with pytest.raises(Refused):
        operator.bearer("guess")


def test_the_login_code_works_once(tmp_path: Path) -> None:
    operator = LocalOperator.start(tmp_path)
    code = operator.login_code
    assert code is not None
    with pytest.raises(Refused):
        operator.log_in("guess")
    session = operator.log_in(code)
    assert operator.session(session) == operator.person
    with pytest.raises(Refused):
        operator.log_in(code)
    assert operator.session(operator.log_in(operator.token)) == operator.person
