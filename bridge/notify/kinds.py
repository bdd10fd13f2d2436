"""The kinds of notification target `notify.targets` may name, and the Notifier the settings
describe: the one module of bridge.notify that reads the configuration.

A target's URL comes from the settings (file or environment) or from a Key Vault secret
(`url_secret`, in notify.key_vault), read once at start with the consumer's identity as its
signing key is. A new kind is a function in bridge.notify.formats and one line in KINDS.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from bridge.cloud import keyvault
from bridge.config import Config, ConfigError, NotifyTarget
from bridge.notify import formats
from bridge.notify.formats import Format
from bridge.notify.notifier import Delivery, Notifier, Target
from bridge.specs import Kind, Kinds

KINDS: Kinds[Format] = Kinds(
    "notification target kind",
    Kind("generic", None, lambda _, __: formats.generic),
    Kind("teams", None, lambda _, __: formats.teams),
    Kind("slack", None, lambda _, __: formats.slack),
)

SecretReader = Callable[[str], str]


def check_config(config: Config) -> None:
    """ConfigError naming the setting unless every target can be built: checked at start."""
    settings = config.notify
    secret_targets = [t.name for t in settings.targets if t.url_secret]
    if secret_targets and not settings.key_vault.lower().startswith("https://"):
        raise ConfigError(
            f"notify.key_vault: targets {', '.join(secret_targets)} read their "
            "URL from Key Vault (url_secret): set notify.key_vault to the vault's "
            "https:// address"
        )
    if settings.page_url:
        _check_page_url(settings.page_url)
    for target in settings.targets:
        KINDS.check(target.kind, config, f"notify.targets ({target.name})")


def _check_page_url(url: str) -> None:
    """The page's links and forms lead from its root (`/events/...`, `/decide`, `/style.css`),
    as the Functions app serves it (host.json's empty routePrefix): under a path they would
    lead off the page, so such an address is refused rather than sent in every notice."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as err:
        raise ConfigError(f"notify.page_url: {url!r} is not an address: {err}") from None
    if (
        parts.scheme.lower() not in ("https", "http")
        or not parts.hostname
        or "@" in parts.netloc
        or url != url.strip()
    ):
        raise ConfigError(
            f"notify.page_url: expected an http(s) address such as https://HOST/, got {url!r}"
        )
    if parts.path not in ("", "/") or "?" in url or "#" in url:
        raise ConfigError(
            f"notify.page_url: the approval page is served at the root of its host, "
            f"so give its address without a path: "
            f"{parts.scheme}://{parts.netloc}/, not {url!r}"
        )


def build(
    config: Config,
    registry: CollectorRegistry | None = None,
    read_secret: SecretReader | None = None,
) -> Notifier:
    """The Notifier of `config.notify`, its threads started; ConfigError naming what is wrong.

    `read_secret` reads a Key Vault secret by its URL (default: with config.identity)."""
    check_config(config)
    settings = config.notify
    reader = read_secret or (lambda url: keyvault.read_secret(url, config.identity))
    targets = [
        Target(t.name, KINDS.build(t.kind, config), _url(t, settings.key_vault, reader))
        for t in settings.targets
    ]
    delivery = Delivery(
        timeout=settings.timeout,
        attempts=settings.attempts,
        max_backoff=settings.max_backoff,
        queue_size=settings.queue_size,
        page_url=settings.page_url,
    )
    return Notifier(targets, delivery, registry)


def _url(target: NotifyTarget, vault: str, read_secret: SecretReader) -> str:
    if target.url:
        return target.url
    try:
        url = read_secret(f"{vault.rstrip('/')}/secrets/{target.url_secret}").strip()
    except keyvault.KeyVaultError as err:
        raise ConfigError(f"notify.targets ({target.name}): url_secret: {err}") from None
    if not url.lower().startswith(("https://", "http://")):
        # Say only where: the value is a secret, and it may be one that is not a URL at all.
        raise ConfigError(
            f"notify.targets ({target.name}): the Key Vault secret "
            f"{target.url_secret} holds no http(s) address"
        )
    return url
