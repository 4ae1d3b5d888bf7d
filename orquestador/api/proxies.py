"""Whose word about a request counts: the direct peer's, when it is one of TRUSTED_PROXIES.

A reverse proxy tells the app what it saw (the client's scheme and host, a trace it
started) in headers any client could send as well; they count only when the TCP peer
itself, never an address a header names, is in TRUSTED_PROXIES. Empty: nobody's,
loopback included.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address

from flask import request

from orquestador.api.context import api_context


def peer_is_trusted(remote_addr: str | None, networks: Sequence[IPv4Network | IPv6Network]) -> bool:
    """Whether REMOTE_ADDR (the direct peer) is in one of NETWORKS."""
    if not networks:
        return False
    try:
        peer = ip_address(remote_addr or "")
    except ValueError:
        return False  # a unix socket, say: no address to trust
    if isinstance(peer, IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return any(peer in network for network in networks)


def from_trusted_proxy() -> bool:
    """Whether this request's direct peer is one of TRUSTED_PROXIES."""
    return peer_is_trusted(request.remote_addr, api_context().settings.trusted_proxy_networks)
