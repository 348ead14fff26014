"""carc's Docker networks: where a sandbox-side service reaches the host, and the networks carc
makes (the proxies' egress bridge; one internal /28 per cell, whose only members are the cell's
sandboxes and its proxy, and which gives the host no address).

Where a service reaches the host is the gateway address of a Docker bridge network.

Docker reports a bridge's gateway in `IPAM.Config[i].Gateway` only sometimes: Debian's docker.io
20.10 on a fresh engine gives the default bridge `{"Config": [{"Subnet": "172.17.0.0/16"}]}`
although `docker0` carries 172.17.0.1, and a network created with a subnet alone reports no
gateway either. So the address is found, in this order, from:

1. IPAM's `Gateway`, when an IPv4 entry has one;
2. the bridge interface's own IPv4 address on this host — the network's
   `com.docker.network.bridge.name` option, else `docker0` for the default bridge, else Docker's
   `br-<first 12 characters of the id>` for a user-defined one — when it lies in the subnet;
3. the first host of the IPv4 subnet (Docker's own default gateway choice).

When none works, `NoGatewayError` names every field and interface looked at.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import psutil
import structlog

from orchestrator.errors import MachineError
from sandboxes.environment import SandboxError
from sandboxes.images import machine_lock

log = structlog.get_logger("carc.sandbox")

EGRESS_NETWORK = "carc-egress"  # the shared bridge the proxies reach the model host through
CELL_POOL = ipaddress.ip_network(os.environ.get("CARC_CELL_POOL", "10.213.0.0/16"))  # cells' /28s

BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
DEFAULT_BRIDGE = "bridge"
DEFAULT_BRIDGE_INTERFACE = "docker0"

Interfaces = Mapping[str, list[str]]  # interface name -> its IPv4 addresses


class NoGatewayError(MachineError):
    """No IPv4 gateway address could be found for a Docker network."""


def host_interfaces() -> dict[str, list[str]]:
    """This host's network interfaces and their IPv4 addresses."""
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def bridge_interface(attrs: Mapping[str, Any]) -> str | None:
    """The host-side interface of a bridge network, by Docker's naming rules (None if not a bridge)."""
    options = attrs.get("Options") or {}
    if options.get(BRIDGE_NAME_OPTION):
        return options[BRIDGE_NAME_OPTION]
    if attrs.get("Driver", "bridge") != "bridge":
        return None
    if attrs.get("Name") == DEFAULT_BRIDGE:
        return DEFAULT_BRIDGE_INTERFACE
    network_id = attrs.get("Id") or ""
    return f"br-{network_id[:12]}" if network_id else None


def ipv4_subnets(attrs: Mapping[str, Any]) -> list[ipaddress.IPv4Network]:
    """The IPv4 subnets of a network's IPAM config (entries without a subnet or IPv6 skipped)."""
    subnets = []
    for entry in (attrs.get("IPAM") or {}).get("Config") or []:
        try:
            subnet = ipaddress.ip_network(entry.get("Subnet") or "", strict=False)
        except ValueError:
            continue
        if isinstance(subnet, ipaddress.IPv4Network):
            subnets.append(subnet)
    return subnets


def gateway_address(attrs: Mapping[str, Any], interfaces: Interfaces) -> str:
    """The IPv4 gateway of a network, from its `docker network inspect` attributes and this
    host's interfaces (see the module docstring for the order)."""
    name = attrs.get("Name") or attrs.get("Id") or "?"
    looked = []
    config = (attrs.get("IPAM") or {}).get("Config") or []
    for entry in config:
        gateway = (entry.get("Gateway") or "").split("/")[0]
        try:
            if gateway and ipaddress.ip_address(gateway).version == 4:
                return gateway
        except ValueError:
            looked.append(f"IPAM.Config Gateway {gateway!r} is not an address")
    looked.append(f"IPAM.Config has no IPv4 Gateway ({len(config)} entries)")

    subnets = ipv4_subnets(attrs)
    interface = bridge_interface(attrs)
    if interface is None:
        looked.append(f"driver {attrs.get('Driver')!r} has no bridge interface")
    elif interface not in interfaces:
        looked.append(f"interface {interface} is not on this host")
    else:
        addresses = [ipaddress.ip_address(a) for a in interfaces[interface]]
        inside = [a for a in addresses if any(a in s for s in subnets)] if subnets else addresses
        if inside:
            return str(inside[0])
        looked.append(f"interface {interface} has no IPv4 address in the subnet "
                      f"({', '.join(map(str, addresses)) or 'none'})")

    for subnet in subnets:
        if subnet.num_addresses > 2:
            return str(next(subnet.hosts()))
    looked.append("IPAM.Config has no IPv4 Subnet with a host address")
    raise NoGatewayError(
        f"no IPv4 gateway for Docker network {name!r}: " + "; ".join(looked) + ". "
        f"Check `docker network inspect {name}` (IPAM.Config) and `ip -4 addr`; "
        "the network needs an IPv4 subnet, or recreate it with --gateway.")


def network_gateway(client: docker.DockerClient, network: str) -> str:
    """The IPv4 gateway of a named Docker network on this host's engine."""
    return gateway_address(client.networks.get(network).attrs, host_interfaces())


def host_address(client: docker.DockerClient) -> str:
    """The address a sandbox-side service (a proxy container, `host-gateway`) reaches the host
    on: the default bridge's gateway. A host service it must reach listens there."""
    return network_gateway(client, DEFAULT_BRIDGE)


# --- carc's own networks: the proxies' egress bridge, one internal /28 per cell ----------------

def ensure_egress_network(client: docker.DockerClient) -> str:
    """The shared bridge the proxies reach the model host through (never joined by a sandbox)."""
    with machine_lock("networks"):
        if not client.networks.list(names=[EGRESS_NETWORK]):
            client.networks.create(EGRESS_NETWORK, driver="bridge",
                                   labels={"org.carc.shared": "egress"})
    return EGRESS_NETWORK


def create_cell_network(client: docker.DockerClient, name: str, labels: dict[str, str]):
    """`<name>-net`, an internal /28 from carc's own pool (Docker's default pools run out after
    ~30 networks), with `labels`.

    `inhibit_ipv4` leaves the host without an address on the bridge, so the sandbox cannot reach
    any service on the host either; the proxy is the only other member.
    """
    with machine_lock("networks"):
        used = set()
        for net in client.networks.list():
            for config in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if config.get("Subnet"):
                    used.add(ipaddress.ip_network(config["Subnet"], strict=False))
        for subnet in CELL_POOL.subnets(new_prefix=28):
            if any(subnet.overlaps(u) for u in used):
                continue
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet))])
            try:
                return client.networks.create(
                    f"{name}-net", driver="bridge", internal=True, ipam=ipam,
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"},
                    labels=labels)
            except docker.errors.APIError as exc:
                if "overlap" in str(exc).lower():
                    used.add(subnet)
                    continue
                raise
    raise SandboxError(f"no free /28 left in {CELL_POOL} (set CARC_CELL_POOL, or run "
                       f"`carc sandboxes prune`)")


def pinned_address(network) -> str | None:
    """The proxy's fixed address on a cell network: the subnet's last host, which the engine,
    handing out from the bottom, gives nobody else; fixed, so a restarted proxy keeps it. None
    when the engine does not report the subnet (then the sandbox keeps Docker's resolver alone,
    whose lookups of outside names time out instead of failing at once)."""
    for subnet in ipv4_subnets(network.attrs):
        if subnet.num_addresses >= 8:
            return str(subnet.broadcast_address - 1)
    return None


def remove_network(net) -> None:
    """Disconnect whatever is still attached, then remove; members may vanish meanwhile (other
    teardowns run at the same time), which must not leave the /28 allocated."""
    try:
        net.reload()
    except docker.errors.NotFound:
        return
    for container_id in (net.attrs.get("Containers") or {}):
        try:
            net.disconnect(container_id, force=True)
        except docker.errors.APIError:
            pass  # already gone
    try:
        net.remove()
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        log.warning("teardown_network", name=net.name, error=str(exc))
