"""An IPv6 client is counted by its /64, an IPv4-mapped address as its IPv4: a host given a
/64 picks any of its 2^64 addresses, and keyed by address it was that many anonymous clients,
each with its own rate limit, sessions and connections (``addresses.py``)."""

from __future__ import annotations

from agent_gateway.access import AccessControl
from agent_gateway.addresses import client_key
from agent_gateway.listener import Connections
from tests.support import config_of


def test_a_client_key_is_the_ipv4_address_or_the_ipv6_64() -> None:
    assert client_key("127.0.0.2") == "127.0.0.2"
    assert client_key("::ffff:127.0.0.2") == "127.0.0.2"
    assert client_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert client_key("::1") == "::/64"
    assert client_key("unix") == "unix"
    assert client_key("fe80::1%eth0") == "fe80::1%eth0"  # every host on the link is in fe80::/64
    assert client_key("64:ff9b::a00:7") == "10.0.0.7"  # NAT64: the IPv4 client behind it


def test_anonymous_clients_in_one_64_are_one_client() -> None:
    access = AccessControl(config_of({"upstreams": {}}).auth)
    one = access.principal(None, "2001:db8:1:2::1")
    assert access.principal(None, "2001:db8:1:2:ffff:ffff:ffff:fffe") is one
    assert access.principal(None, "2001:db8:1:3::1") is not one  # the next /64: another client
    mapped = access.principal(None, "::ffff:10.0.0.7")
    assert access.principal(None, "10.0.0.7") is mapped
    assert one.label == "anonymous@2001:db8:1:2::/64"


def test_connections_from_one_64_share_its_cap() -> None:
    connections = Connections(cap=100, per_address=2, header_timeout=10)
    assert connections.admit("2001:db8::1") is None
    assert connections.admit("2001:db8::2") is None
    refused = connections.admit("2001:db8::3")
    assert refused == "2 connections open from 2001:db8::/64, the limit is 2"
    assert connections.admit("2001:db8:0:1::3") is None  # another /64
    connections.release("2001:db8::1")
    assert connections.admit("2001:db8::3") is None
