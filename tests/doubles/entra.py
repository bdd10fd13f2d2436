"""A stand-in for Entra ID's side of a token: a tenant whose signing keys are served as a JWKS
over real HTTP on loopback, and tokens it signs with them (RS256), shaped as Entra ID's access
tokens are (iss, aud, oid, name, roles, exp, nbf, iat, kid in the header)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.doubles import httpdouble
from tests.doubles.httpdouble import Asked, Reply

TENANT = "11111111-2222-3333-4444-555555555555"
AUDIENCE = "api://se-bridge-test"
ROLE = "SeBridge.Decide"


class Tenant:
    """One tenant: a signing key (kid `k1`) and the JWKS address that publishes it."""

    def __init__(self, tenant_id: str = TENANT) -> None:
        self.tenant_id = tenant_id
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "k1"
        self.jwks_url = ""
        self.fetches = 0

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def token(
        self,
        *,
        oid: str = "0b1c2d3e-0000-4000-8000-000000000001",
        name: str = "Dana Operator",
        roles: tuple[str, ...] = (ROLE,),
        audience: str = AUDIENCE,
        issuer: str | None = None,
        lifetime: float = 3600.0,
        age: float = 0.0,
        kid: str | None = None,
        key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        now = time.time() - age
        claims: dict[str, Any] = {
            "iss": issuer or f"https://login.microsoftonline.com/{self.tenant_id}/v2.0",
            "aud": audience,
            "tid": self.tenant_id,
            "oid": oid,
            "name": name,
            "iat": int(now),
            "nbf": int(now),
            "exp": int(now + lifetime),
        }
        if roles:
            claims["roles"] = list(roles)
        return jwt.encode(
            claims, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid}
        )


@contextmanager
def serving(tenant: Tenant) -> Iterator[Tenant]:
    """The tenant's JWKS on a free loopback port, for as long as the block runs."""

    def keys() -> bytes:
        tenant.fetches += 1
        return json.dumps(tenant.jwks()).encode()

    with answering(keys, "application/json") as url:
        tenant.jwks_url = f"{url}/{tenant.tenant_id}/keys"
        yield tenant


@contextmanager
def answering(body: Callable[[], bytes], content_type: str) -> Iterator[str]:
    """A loopback HTTP server answering every GET with `body()`; its base URL."""

    def answer(asked: Asked) -> Reply:
        if asked.method != "GET":
            return Reply(501, close=True)
        return Reply(200, body(), (("Content-Type", content_type),))

    with httpdouble.serving(answer, "entra-double") as served:
        yield served.url()
