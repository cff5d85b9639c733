"""Upstream targets that name several model-server replicas: which addresses, and one status.

gRPC targets follow gRPC's own naming (``dns:///host:port``, ``ipv4:a:p,b:p``, ``ipv6:[a]:p``).
``backend.clients.replicas.ReplicaSet`` resolves them (in the background) and keeps one channel
per address, so that each call goes to one chosen replica.
"""

from __future__ import annotations

import ipaddress
import socket

# gRPC name-resolver schemes that may name several endpoints.
SCHEMES = ("dns:", "ipv4:", "ipv6:")


class EndpointError(ValueError):
    """A target that cannot be parsed or resolved to any address."""


def is_multi(target: str) -> bool:
    """Return True when ``target`` uses a gRPC resolver scheme (may name several replicas)."""
    return target.startswith(SCHEMES)


def split_host_port(address: str) -> tuple[str, str]:
    """Return (host, port) of ``host:port`` or ``[v6]:port``."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise EndpointError(f"{address!r} is not host:port")
    return host.strip("[]"), port


def lookup(address: str) -> list[str]:
    """Return ``host:port`` for every address ``host`` resolves to (IPv4 first, as gRPC's dns).

    An IP literal is returned as it is; a name resolving to nothing raises EndpointError.
    """
    host, port = split_host_port(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"]
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        raise EndpointError(f"cannot resolve {host!r}: {exc}") from exc
    v4 = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET})
    v6 = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET6})
    found = [f"{a}:{port}" for a in v4] or [f"[{a}]:{port}" for a in v6]
    if not found:
        raise EndpointError(f"{host!r} resolves to no address")
    return found


def resolve(target: str) -> list[str]:
    """Return the ``host:port`` of every replica ``target`` names, in a stable order.

    Accepts gRPC targets (``dns:///name:port``, ``dns:name:port``, ``ipv4:a:p,b:p``,
    ``ipv6:[a]:p,[b]:p``), and comma-separated ``host:port`` lists; names are looked up in DNS.
    """
    if target.startswith(("ipv4:", "ipv6:")):
        addresses = [a.strip() for a in target.split(":", 1)[1].split(",") if a.strip()]
        return list(dict.fromkeys(a for address in addresses for a in lookup(address)))
    if target.startswith("dns:"):
        rest = target[len("dns:") :]
        if rest.startswith("//"):  # dns://[authority]/host:port; the authority is not used here
            rest = rest[2:].partition("/")[2]
        target = rest
    addresses = [a.strip() for a in target.split(",") if a.strip()]
    if not addresses:
        raise EndpointError(f"{target!r} names no address")
    return list(dict.fromkeys(a for address in addresses for a in lookup(address)))
