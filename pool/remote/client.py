"""How one ``remote`` worker reaches its upstream: :class:`UpstreamClient`.

Without an egress proxy the requests go through poolgate's own HTTP/1.1
client (:mod:`.h1`); through a proxy (HTTP CONNECT or SOCKS), through an
aiohttp session (with aiohttp-socks). Either way the worker gets a response
it reads the same way (``status``, ``headers``, ``content``, ``release()``,
``close()``), and a request that cannot be sent or gets no answer is the
:class:`GatewayError` a client is told (logged, never with the URL or key).
"""

from __future__ import annotations

from typing import Any, Mapping

import aiohttp
import structlog
from aiohttp_socks import ProxyConnectionError, ProxyConnector, ProxyError, ProxyTimeoutError
from yarl import URL

from pool.deadline import Deadline
from pool.errors import BadRequest, UpstreamTimeout, UpstreamUnavailable

from . import h1
from .spec import RemoteSpec

__all__ = ["UpstreamClient", "SOCKS_ERRORS"]

log = structlog.get_logger("pool.remote")

# aiohttp-socks' failures to reach (or be let through) a SOCKS proxy: not aiohttp's own
SOCKS_ERRORS = (ProxyConnectionError, ProxyError, ProxyTimeoutError)


class UpstreamClient:
    """The keep-alive connections of one worker (``name``) to its upstream,
    every request with ``headers`` (the worker's defaults and credentials)."""

    __slots__ = ("spec", "name", "_origin", "_session")

    def __init__(self, spec: RemoteSpec, url: URL, headers: Mapping[str, str]) -> None:
        self.spec = spec
        self.name = spec.name
        self._origin: h1.Origin | None = None
        self._session: aiohttp.ClientSession | None = None
        if spec.proxy is None:
            self._origin = h1.Origin(url, limit=spec.max_connections,
                                     connect_timeout=spec.connect_timeout, headers=headers)
        else:
            self._session = _proxied_session(spec, spec.proxy, headers)

    async def post(self, url: URL | str, body: bytes, headers: Mapping[str, str]) -> Any:
        """The response to a POST once its status and headers came (any status),
        within ``first_byte_timeout`` (which covers the wait for a connection)."""
        spec = self.spec
        try:
            with Deadline(spec.first_byte_timeout):
                if self._origin is not None:
                    return await self._origin.request("POST", url, headers, body)
                assert self._session is not None
                return await self._session.post(url, data=body, headers=headers,
                                                allow_redirects=False)
        except h1.InvalidHeader as exc:  # a header a client sent on that cannot go out
            raise BadRequest(str(exc), param=exc.name) from None
        except (aiohttp.ConnectionTimeoutError, h1.ConnectTimeout):
            log.warning("remote.connect_timeout", worker=self.name)
            raise UpstreamTimeout(f"could not connect to upstream {self.name} within "
                                  f"{spec.connect_timeout:g}s") from None
        except TimeoutError:
            log.warning("remote.first_byte_timeout", worker=self.name)
            raise UpstreamTimeout(f"upstream {self.name} did not answer within "
                                  f"{spec.first_byte_timeout:g}s") from None
        except (aiohttp.ClientProxyConnectionError, *SOCKS_ERRORS):
            log.warning("remote.proxy_connect_failed", worker=self.name)
            raise UpstreamUnavailable(f"cannot connect to the egress proxy of upstream "
                                      f"{self.name}") from None
        except (aiohttp.ClientConnectorError, h1.ConnectFailed):
            log.warning("remote.connect_failed", worker=self.name)
            raise UpstreamUnavailable(f"cannot connect to upstream {self.name}") from None
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("remote.request_failed", worker=self.name, error=type(exc).__name__)
            raise UpstreamUnavailable(f"upstream {self.name} failed before answering") from None

    async def probe(self, url: str) -> int:
        """The status of a GET of ``url`` (its body is not read); the caller
        bounds the time. Raises what a broken connection raises (``OSError``,
        aiohttp's and aiohttp-socks' errors)."""
        if self._origin is not None:
            resp: Any = await self._origin.request("GET", url, {})
        else:
            assert self._session is not None
            resp = await self._session.get(url, allow_redirects=False)
        resp.release()
        return int(resp.status)

    async def aclose(self) -> None:
        if self._origin is not None:
            await self._origin.aclose()
        if self._session is not None:
            await self._session.close()


def _proxied_session(spec: RemoteSpec, proxy: str,
                     headers: Mapping[str, str]) -> aiohttp.ClientSession:
    connector: aiohttp.TCPConnector
    if proxy.startswith("socks"):
        # the upstream's name resolved by the proxy (rdns), not here
        connector = ProxyConnector.from_url(proxy, rdns=True, limit=spec.max_connections,
                                            limit_per_host=0)
        http_proxy = None
    else:
        connector = aiohttp.TCPConnector(limit=spec.max_connections, limit_per_host=0)
        http_proxy = proxy
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=spec.connect_timeout)
    # no cookie jar: upstream cookies are never wanted (and it costs on every request).
    # trust_env off: the gateway's own HTTP(S)_PROXY/NO_PROXY never route a worker;
    # its configured proxy takes every request, the probe included, or none goes
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=dict(headers),
                                 auto_decompress=False, raise_for_status=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                                 proxy=http_proxy)
