"""The SSRF guard for URLs the server fetches on a client's behalf (image URLs).

A client may name any URL; fetching it from inside the server's network must not reach what only the
server can reach (loopback services, the LAN, the cloud metadata endpoint at 169.254.169.254). So,
before any connection:

- only `http` and `https` are fetched (`file:`, `ftp:`, `gopher:` ... are refused);
- the host is read as an IP address where it is one, in any spelling the C library accepts
  (`2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`), else resolved through an injectable resolver;
- every address it resolves to must be public: loopback, private, link-local, multicast, reserved,
  unspecified, shared (100.64/10) and documentation addresses are refused, also when wrapped in an
  IPv6 address (IPv4-mapped, 6to4, Teredo);
- the request then goes to the checked address itself (`pinned_request`: the URL's host replaced by
  the address, `Host` and TLS SNI/certificate name kept), so a second DNS answer (DNS rebinding)
  cannot send it elsewhere. Every redirect hop goes through the same check.

`allow_private` (`--allow-private-image-urls`) skips the address check, for local use and tests;
the scheme check stays.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port -> the addresses it resolves to (as text); the default asks the system resolver.
Resolver = Callable[[str, int], Awaitable[list[str]]]

SCHEMES = ("http", "https")
# What inet_aton may read as an IPv4 address: digits, hex and dots ("127.1", "0x7f000001").
_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")


class URLRefused(ValueError):
    """The URL may not be fetched; the message says why, in words for the client."""


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of `host` from the system resolver (off the event loop: asyncio runs it in a thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def literal_ip(host: str) -> IPAddress | None:
    """`host` as an IP address when it spells one (also the decimal, hex and short IPv4 forms), else None.

    Read here rather than by the resolver so that those spellings are checked even with a stub resolver.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(bare) and any(c.isdigit() for c in bare):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            return None
    return None


def refusal(ip: IPAddress) -> str | None:
    """Why the server must not connect to `ip` (e.g. "loopback"), or None for a public address."""
    ip = ipaddress.ip_address(str(ip).split("%", 1)[0])  # an IPv6 zone id does not change the address
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in (ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())):
            if inner is not None and (why := refusal(inner)) is not None:
                return f"{why} (inside the IPv6 address {ip})"
    checks = (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
              ("multicast", ip.is_multicast), ("private", ip.is_private), ("reserved", ip.is_reserved))
    for name, hit in checks:
        if hit:
            return name
    return None if ip.is_global else "not public"  # shared 100.64/10 and the like


async def checked_address(url: httpx.URL, resolver: Resolver, allow_private: bool) -> str:
    """The address to connect to for `url`: its scheme allowed and, unless `allow_private`, every address
    its host resolves to public. Raises URLRefused; connects to nothing."""
    if url.scheme not in SCHEMES:
        raise URLRefused(f"URLs of scheme '{url.scheme or '(none)'}' are not fetched; send an http(s) or data: URL")
    if not url.host:
        raise URLRefused("the URL has no host")
    literal = literal_ip(url.host)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(url.host, url.port or (443 if url.scheme == "https" else 80))
        except (OSError, UnicodeError) as exc:
            raise URLRefused(f"the host '{url.host}' could not be resolved") from exc
    if not addresses:
        raise URLRefused(f"the host '{url.host}' could not be resolved")
    if not allow_private:
        for address in addresses:
            why = refusal(ipaddress.ip_address(address.split("%", 1)[0]))
            if why is not None:
                raise URLRefused(f"the host '{url.host}' is a {why} address ({address}); the server does not "
                                 "fetch from its own network (--allow-private-image-urls allows it)")
    return addresses[0]


def pinned_request(client: httpx.AsyncClient, url: httpx.URL, address: str) -> httpx.Request:
    """A GET of `url` sent to `address`: the URL's host is replaced by the checked address, while the
    `Host` header and, for https, the TLS server name (SNI and the certificate check) stay the URL's host."""
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    return client.build_request("GET", url.copy_with(host=address.split("%", 1)[0]),
                                headers={"Host": url.netloc.decode("ascii")}, extensions=extensions)
