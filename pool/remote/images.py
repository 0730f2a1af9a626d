"""Image URLs under the worker's ``image_urls`` rule, before anything is sent.

A URL in a client's message makes whoever fetches it reach out from where it
runs: a self-hosted engine inside the operator's network would fetch
``http://10.0.0.7/admin`` for anyone (SSRF). So by default only inline images
(``data:`` URLs, base64 sources) go on, and a URL is a 400 naming the
parameter. ``"fetch"``: poolgate fetches the image itself, refusing private,
loopback, link-local and other non-public addresses (checked on the address it
connects to, so DNS cannot point it elsewhere), no redirects, at most
``image_max_bytes``, and sends it inline. ``"forward"``: URLs go on as sent
(for a vendor API that fetches from the public internet).

A worker with an egress ``proxy`` fetches through it, like the rest of its
traffic (nothing goes direct). The proxy then resolves the name and connects:
the gateway still refuses literal non-public addresses and names that
resolve *here* to one; a name only the proxy can resolve is the proxy's to
police.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from aiohttp_socks import ProxyConnectionError, ProxyConnector, ProxyError, ProxyTimeoutError

from pool.errors import BadRequest
from pool.model import ChatRequest, ImagePart, Message, ToolResultPart

from .policy import PassPolicy

__all__ = ["vet_images"]

_FETCH_TIMEOUT = 10.0


async def vet_images(request: ChatRequest, policy: PassPolicy,
                     proxy: str | None = None) -> ChatRequest:
    """``request`` as the worker may send it: unchanged, with its image URLs
    fetched (through ``proxy``, the worker's egress proxy, when it has one)
    and inlined, or refused (``BadRequest``)."""
    if policy.image_urls == "forward" or not _any_url(request.messages):
        return request
    param = "input" if request.dialect == "openai_responses" else "messages"
    if policy.image_urls == "data_only":
        raise BadRequest(f"{param}: image URLs are not accepted here; send the image inline (a "
                         "data: URL or a base64 source).", param=param)
    fetched: dict[str, ImagePart] = {}
    for message in request.messages:
        for url in _urls(message):
            if url not in fetched:
                fetched[url] = await _fetch(url, policy.image_max_bytes, param, proxy)
    messages = tuple(_inline(m, fetched) for m in request.messages)
    # the client's body still holds the URLs: send the translated request instead
    return replace(request, messages=messages, raw={})


def _parts(message: Message) -> Any:
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            yield from part.content
        else:
            yield part


def _any_url(messages: tuple[Message, ...]) -> bool:
    """Whether any image in ``messages`` (tool results' included) is a URL: on
    every request, so plain loops (a long conversation has hundreds of parts)."""
    for message in messages:
        for part in message.parts:
            if isinstance(part, ImagePart):
                if part.url:
                    return True
            elif isinstance(part, ToolResultPart):
                for inner in part.content:
                    if isinstance(inner, ImagePart) and inner.url:
                        return True
    return False


def _urls(message: Message) -> list[str]:
    return [p.url for p in _parts(message) if isinstance(p, ImagePart) and p.url]


def _inline(message: Message, fetched: dict[str, ImagePart]) -> Message:
    def swap(part: Any) -> Any:
        if isinstance(part, ImagePart) and part.url:
            return replace(fetched[part.url], detail=part.detail)
        if isinstance(part, ToolResultPart):
            return replace(part, content=tuple(swap(p) for p in part.content))
        return part

    return replace(message, parts=tuple(swap(p) for p in message.parts))


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _PublicOnly(AbstractResolver):
    """Resolves like the default resolver but keeps public addresses only."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = [r for r in await self._inner.resolve(host, port, family) if _public(r["host"])]
        if not found:
            raise OSError(f"{host} has no public address")
        return found

    async def close(self) -> None:
        await self._inner.close()


async def _private_here(host: str) -> bool:
    """Whether ``host`` resolves here to any non-public address (a name that
    does not resolve here is left to the proxy)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, None)
    except OSError:
        return False
    return any(not _public(str(info[4][0])) for info in found)


def _connector(proxy: str | None) -> tuple[aiohttp.BaseConnector, str | None]:
    """The connector of one fetch, and the HTTP proxy its requests name."""
    if proxy is None:
        return aiohttp.TCPConnector(resolver=_PublicOnly()), None
    if proxy.startswith("socks"):
        return ProxyConnector.from_url(proxy, rdns=True), None  # the name resolved there
    return aiohttp.TCPConnector(), proxy


async def _fetch(url: str, max_bytes: int, param: str, proxy: str | None) -> ImagePart:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"{param}: image URLs must be http:// or https://.", param=param)
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        literal = None
    if literal is not None and not _public(str(literal)):
        raise BadRequest(f"{param}: the image URL points to a private or loopback address.",
                         param=param)
    try:
        async with asyncio.timeout(_FETCH_TIMEOUT):
            if proxy is not None and await _private_here(parts.hostname):
                raise OSError("a private address")
            connector, via = _connector(proxy)
            # trust_env off: the gateway's own proxy variables never route a fetch
            async with aiohttp.ClientSession(connector=connector, trust_env=False,
                                             proxy=via) as session, \
                    session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise BadRequest(f"{param}: fetching the image URL gave HTTP {resp.status}.",
                                     param=param)
                media_type = resp.content_type
                if not media_type.startswith("image/"):
                    raise BadRequest(f"{param}: the image URL did not return an image.",
                                     param=param)
                data = await resp.content.read(max_bytes + 1)
    except BadRequest:
        raise
    except OSError:
        # our resolver's refusal arrives as a connector error
        raise BadRequest(f"{param}: the image URL points to a private or loopback address, or "
                         "cannot be reached.", param=param) from None
    except (aiohttp.ClientError, TimeoutError, ProxyConnectionError, ProxyError, ProxyTimeoutError):
        raise BadRequest(f"{param}: the image URL could not be fetched.", param=param) from None
    if len(data) > max_bytes:
        raise BadRequest(f"{param}: the image at the URL is larger than {max_bytes} bytes.",
                         param=param)
    return ImagePart(data=base64.b64encode(data).decode("ascii"), media_type=media_type)
