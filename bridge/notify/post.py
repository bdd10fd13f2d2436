"""One POST to a webhook whose answer matters only for its status: the body is never read, the
whole post has a deadline, and another thread (the notifier's close) can hang up on it.

A timeout between bytes alone lets a receiver that sends a byte every few seconds hold the
post, and its thread, for ever; a body read whole lets it fill the consumer's memory (a 400 MB
answer took a consumer from 30 MB to 814 MB). So each post's sockets are known from the moment
they are made (before a TLS handshake or a proxy's tunnel), and a timer shuts them at the
deadline: whatever requests was reading then fails at once. requests still does everything
else (proxies from the environment, TLS, its CA bundle).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.poolmanager import ProxyManager

_current = threading.local()  # the Post the thread that makes a connection is in


class PostCut(Exception):
    """The post was hung up on: at its deadline or by `cut`."""


class Post:
    """The sockets of one post on this thread, with a deadline; `cut` (from any thread) ends
    it, and a socket made after the cut is shut as it is made."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.cut_off = False
        self._timer = threading.Timer(seconds, self.cut)
        self._timer.daemon = True

    def __enter__(self) -> Post:
        _current.post = self
        self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        _current.post = None
        self.cut()  # the answer is never read to its end: nothing of it is kept

    def cut(self) -> None:
        with self._lock:
            self.cut_off = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            if not self.cut_off:
                self._sockets.append(sock)
                return
        _shut(sock)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: a read blocked in another thread returns at once, and the socket
    # stays the owner's to close. The plain socket's shutdown, also under TLS, so that no TLS
    # state changes under a reader.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _register(sock: socket.socket) -> socket.socket:
    post: Post | None = getattr(_current, "post", None)
    if post is not None:
        post.opened(sock)
    return sock


class _Connection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _register(super()._new_conn())


class _TlsConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _register(super()._new_conn())


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


_POOLS: dict[str, Any] = {"http": _Pool, "https": _TlsPool}


class _Adapter(HTTPAdapter):
    """requests' adapter whose connections (direct, or through an HTTP proxy) are known to
    the Post they are made in."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):  # a SOCKS proxy keeps its own connections
            manager.pool_classes_by_scheme = _POOLS
        return manager


def post(
    url: str, body: bytes, headers: dict[str, str], *, timeout: float, cut: Post
) -> requests.Response:
    """POST `body`; the answer with its status and headers, its body unread and closed.
    PostCut when `cut` hung up on it; requests' errors otherwise."""
    with requests.Session() as session:
        adapter = _Adapter()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        try:
            answer = session.post(
                url,
                data=body,
                headers=headers,
                timeout=(timeout, timeout),
                allow_redirects=False,
                stream=True,
            )
        except requests.RequestException:
            if cut.cut_off:
                raise PostCut() from None
            raise
        answer.close()
        return answer
