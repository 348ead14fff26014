"""The host address a sandbox-side service uses: IPAM shapes seen in the wild, then the live engine."""

from __future__ import annotations

import ipaddress

import docker
import pytest

from sandboxes.networks import NoGatewayError, gateway_address, host_address, network_gateway
from tests.docker_fixtures import base_image, client, run_id, _prune_at_end  # noqa: F401

# `docker network inspect bridge` on a fresh Debian docker.io 20.10 engine (issue 11).
DEBIAN_FRESH_BRIDGE = {"Name": "bridge", "Id": "5f1c0d2e9a7b" + "0" * 52, "Driver": "bridge",
                       "Options": None, "IPAM": {"Driver": "default", "Options": None,
                                                 "Config": [{"Subnet": "172.17.0.0/16"}]}}
HOST = {"lo": ["127.0.0.1"], "eth0": ["10.0.2.15"], "docker0": ["172.17.0.1"]}


def network(**changes):
    return {**DEBIAN_FRESH_BRIDGE, **changes}


def ipam(*config):
    return {"Driver": "default", "Options": None, "Config": list(config)}


def test_ipam_gateway_is_taken_when_docker_reports_it():
    attrs = network(IPAM=ipam({"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.9"}))
    assert gateway_address(attrs, HOST) == "172.17.0.9"


def test_without_gateway_the_default_bridge_uses_docker0s_own_address():
    host = {**HOST, "docker0": ["172.17.42.1"]}
    assert gateway_address(DEBIAN_FRESH_BRIDGE, host) == "172.17.42.1"


def test_the_bridge_name_option_names_the_interface():
    attrs = network(Name="carc-egress", Options={"com.docker.network.bridge.name": "carc0"},
                    IPAM=ipam({"Subnet": "172.30.0.0/16"}))
    assert gateway_address(attrs, {**HOST, "carc0": ["172.30.0.7"]}) == "172.30.0.7"


def test_a_user_defined_bridge_is_found_as_br_and_its_short_id():
    attrs = network(Name="carc-egress", Id="a1b2c3d4e5f6" + "9" * 52, IPAM=ipam({"Subnet": "172.18.0.0/16"}))
    assert gateway_address(attrs, {**HOST, "br-a1b2c3d4e5f6": ["172.18.0.5"]}) == "172.18.0.5"


def test_an_interface_address_outside_the_subnet_is_not_taken():
    host = {**HOST, "docker0": ["192.168.99.1"]}
    assert gateway_address(DEBIAN_FRESH_BRIDGE, host) == "172.17.0.1"


def test_without_gateway_or_interface_the_first_host_of_the_subnet_is_used():
    attrs = network(IPAM=ipam({"Subnet": "10.88.4.0/24"}))
    assert gateway_address(attrs, {"lo": ["127.0.0.1"]}) == "10.88.4.1"


def test_an_ipv6_entry_before_the_ipv4_one_is_skipped():
    attrs = network(IPAM=ipam({"Subnet": "fd00:dead::/64", "Gateway": "fd00:dead::1"},
                              {"Subnet": "172.17.0.0/16"}))
    assert gateway_address(attrs, {}) == "172.17.0.1"


def test_a_gateway_written_with_its_prefix_length_is_read():
    attrs = network(IPAM=ipam({"Subnet": "172.19.0.0/16", "Gateway": "172.19.0.1/16"}))
    assert gateway_address(attrs, {}) == "172.19.0.1"


@pytest.mark.parametrize("config", [None, [], [{}], [{"Subnet": "fd00:dead::/64", "Gateway": "fd00:dead::1"}]],
                         ids=["config-null", "config-empty", "entry-empty", "ipv6-only"])
def test_no_ipv4_anywhere_is_an_error_naming_what_was_looked_at(config):
    attrs = network(Name="isolated", IPAM={"Driver": "default", "Config": config})
    with pytest.raises(NoGatewayError) as raised:
        gateway_address(attrs, {"lo": ["127.0.0.1"]})
    message = str(raised.value)
    assert "'isolated'" in message and "IPAM.Config" in message
    assert "docker network inspect isolated" in message


def test_a_missing_ipam_block_and_a_null_driver_are_survived():
    attrs = {"Name": "odd", "Driver": "macvlan", "Options": None, "IPAM": None}
    with pytest.raises(NoGatewayError, match="macvlan"):
        gateway_address(attrs, HOST)


@pytest.mark.docker
def test_live_engine_host_address_is_the_gateway_a_container_routes_through(client, base_image, run_id):
    """Real Docker: a container's default route on the default bridge and on a subnet-only
    network (which reports no Gateway) goes via the address the lookup returns."""
    subnet_only = client.networks.create(
        f"{run_id}-gw-net", driver="bridge", labels={"org.carc.run": run_id},
        ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.214.7.0/24")]))
    try:
        for name, expected in (("bridge", host_address(client)),
                               (subnet_only.name, network_gateway(client, subnet_only.name))):
            out = client.containers.run(base_image, ["cat", "/proc/net/route"], network=name,
                                        remove=False, detach=True, labels={"org.carc.run": run_id})
            out.wait(timeout=60)
            routes = out.logs().decode()
            out.remove(force=True)
            default = next(line.split() for line in routes.splitlines()[1:] if line.split()[1] == "00000000")
            via = str(ipaddress.IPv4Address(bytes.fromhex(default[2])[::-1]))
            assert via == expected, (name, routes)
    finally:
        subnet_only.remove()
