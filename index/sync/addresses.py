"""The one address policy: which IP addresses a fetch made for someone else may connect to.

An address is allowed only when it is global unicast, after unwrapping every
form of IPv6 that carries an IPv4 address (the IPv4 address is then the one
judged, since it is the one the packets end up at):

* IPv4-mapped ``::ffff:0:0/96``, IPv4-compatible ``::/96`` and SIIT
  (IPv4-translated) ``::ffff:0:0:0/96``;
* NAT64 ``64:ff9b::/96``; the local-use NAT64 prefix ``64:ff9b:1::/48`` is
  refused whole (where its IPv4 address sits depends on the operator's prefix
  length, and it is local by definition);
* 6to4 ``2002::/16`` (bits 16-47) and Teredo ``2001::/32`` (the server in bits
  32-63, the client XORed into the last 32 bits): both must be global;
* ISATAP interface identifiers (``…:0:5efe:a.b.c.d``, ``…:200:5efe:a.b.c.d``).

Refused outright: IPv6 outside ``2000::/3`` (the global unicast space:
loopback, unspecified, unique local, link-local, site-local ``fec0::/10``,
multicast, discard ``100::/64``), the IETF protocol block ``2001::/23`` and the
documentation ranges ``2001:db8::/32`` and ``3fff::/20``; IPv4 that is not
global (RFC 6890: private, loopback, link-local and the cloud metadata address,
shared ``100.64.0.0/10``, ``0.0.0.0/8``, benchmarking, the documentation
ranges ``192.0.2.0/24``, ``198.51.100.0/24``, ``203.0.113.0/24``, the 6to4
relay ``192.88.99.0/24``), multicast ``224.0.0.0/4`` and reserved ``240.0.0.0/4``.

The tables are written out here rather than taken from ``ipaddress``'s
``is_global``, whose answers differ between Python versions.
"""

from __future__ import annotations

import ipaddress

__all__ = ["address_refusal", "is_ip_address"]

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

_IPV4_REFUSED: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "an unspecified ('this network') address"),
    (_V4("10.0.0.0/8"), "a private address"),
    (_V4("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("169.254.0.0/16"), "a link-local address (the cloud metadata service is there)"),
    (_V4("172.16.0.0/12"), "a private address"),
    (_V4("192.0.0.0/24"), "an IETF protocol address"),
    (_V4("192.0.2.0/24"), "a documentation address"),
    (_V4("192.88.99.0/24"), "a 6to4 relay address"),
    (_V4("192.168.0.0/16"), "a private address"),
    (_V4("198.18.0.0/15"), "a benchmarking address"),
    (_V4("198.51.100.0/24"), "a documentation address"),
    (_V4("203.0.113.0/24"), "a documentation address"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("240.0.0.0/4"), "a reserved or broadcast address"),
)
_GLOBAL_UNICAST = _V6("2000::/3")
_IPV6_REFUSED: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (_V6("fc00::/7"), "a unique local (private) address"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address"),
    (_V6("ff00::/8"), "a multicast address"),
    (_V6("2001:db8::/32"), "a documentation address"),
    (_V6("3fff::/20"), "a documentation address"),
)
# Prefixes whose last 32 bits are an IPv4 address.
_LAST_32_BITS: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::ffff:0:0/96"), "IPv4-mapped"),
    (_V6("::ffff:0:0:0/96"), "SIIT-translated"),
    (_V6("64:ff9b::/96"), "NAT64"),
    (_V6("::/96"), "IPv4-compatible"),
)
_TEREDO = _V6("2001::/32")
_SIX_TO_FOUR = _V6("2002::/16")
_IETF_PROTOCOLS = _V6("2001::/23")
_ISATAP_IDS = frozenset({0x00005EFE, 0x02005EFE})


def address_refusal(address: str) -> str | None:
    """Why a connection to ``address`` is refused, or ``None`` when it is global unicast.

    ``address`` is an IPv4 or IPv6 address as text (an interface scope such as
    ``%eth0`` is ignored); anything else is refused as not an address.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_refusal(ip)
    return _ipv6_refusal(ip)


def is_ip_address(text: str) -> bool:
    """Whether ``text`` is an IP address (``[ ]`` and an interface scope allowed), not a name."""
    return address_refusal(text) != "not an IP address"


def _ipv4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    for network, reason in _IPV4_REFUSED:
        if ip in network:
            return reason
    # A backstop for a range this table may lack (Python's own registry).
    return None if ip.is_global else "not a globally reachable address"


def _ipv6_refusal(ip: ipaddress.IPv6Address) -> str | None:
    for network, reason in _IPV6_REFUSED:
        if ip in network:
            return reason
    for network, form in _LAST_32_BITS:
        if ip in network:
            return _embedded(form, ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _TEREDO:
        server, client = ip.teredo or (ipaddress.IPv4Address(0), ipaddress.IPv4Address(0))
        return _embedded("Teredo server", server) or _embedded("Teredo client", client)
    if ip in _SIX_TO_FOUR:
        return _embedded("6to4", ip.sixtofour or ipaddress.IPv4Address(0))
    if ip not in _GLOBAL_UNICAST:
        return "not in the global unicast range (2000::/3)"
    if ip in _IETF_PROTOCOLS:
        return "an IETF protocol address"
    if (int(ip) >> 32) & 0xFFFFFFFF in _ISATAP_IDS:
        return _embedded("ISATAP", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return None


def _embedded(form: str, ipv4: ipaddress.IPv4Address) -> str | None:
    reason = _ipv4_refusal(ipv4)
    return f"{form} form of {ipv4}, {reason}" if reason else None
