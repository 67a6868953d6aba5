"""Builds ``onceflow.stores``: the Redis URL and the Cassandra store's settings.

The Cassandra checks refuse a replication and consistency level whose reads
could miss an acknowledged write, which would lose events after a rebalance.
Credentials and TLS files (``username``, ``password``, ``tls``) are checked
here too, so a missing file or a half-given login stops the worker at start.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from pyhocon import ConfigTree

from onceflow.runtime.config_reader import Reader, show
from onceflow.runtime.secrets import read_secret
from onceflow.runtime.settings import (
    CassandraReplication,
    CassandraSettings,
    RedisSettings,
    ReplicationClass,
)
from onceflow.stores.access import StoreAccess, TlsFiles

_REDIS_HINT = "a redis://, rediss:// or unix:// URL"
_HOST = r"[^,\s]+"
_HOSTS_HINT = "a non-empty list of hosts, or one comma-separated string of them"
_KEYSPACE = r"[a-z][a-z0-9_]{0,47}"
_KEYSPACE_HINT = "a keyspace name: a lowercase letter, then up to 47 of [a-z0-9_]"
_DATACENTER = r"[\w.-]{1,100}"
# Same levels as onceflow.stores.cassandra_store.CONSISTENCY_LEVELS (not imported:
# loading settings must not load the Cassandra driver). Replicas each one waits for,
# where that is a fixed number; the others overlap reads with writes by definition.
_CONSISTENCY = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_ONE", "LOCAL_QUORUM")
_FIXED_REPLICAS = {"ONE": 1, "TWO": 2, "THREE": 3, "LOCAL_ONE": 1}


def redis_settings(read: Reader) -> RedisSettings:
    """``onceflow.stores.redis``: URL, key prefix, login, TLS and the replicas to wait for."""
    r = "onceflow.stores.redis."
    url = read.text(r + "url", r"(rediss?|unix)://\S+", _REDIS_HINT)
    access = StoreAccess(_optional_text(read, r + "username"), read_secret(read, r + "password"),
                         _tls(read, r + "tls.", enabled=url.startswith("rediss://")))
    if access.password is not None and urlsplit(url).password is not None:
        raise read.error(r + "password", "expected the password in the url or in password, "
                         "not both (one in the url wins, and shows wherever the url does)")
    if access.tls is None and _tls_files_given(read, r + "tls."):
        raise read.error(r + "url", f"expected a rediss:// URL with {r}tls set, got "
                         f"{url.partition(':')[0]}://")
    return RedisSettings(url, read.text(r + "key-prefix"), access,
                         read.integer(r + "wait-replicas", 0, 100),
                         read.duration(r + "wait-timeout", 0.01, 60))


def _cassandra_access(read: Reader, c: str) -> StoreAccess:
    username = _optional_text(read, c + "username")
    password = read_secret(read, c + "password")
    if (username is None) != (password is None):
        missing = "password" if password is None else "username"
        raise read.error(c + missing, "expected both username and password "
                         "(PasswordAuthenticator), or neither")
    enabled = read.boolean(c + "tls.enabled")
    if not enabled and _tls_files_given(read, c + "tls."):
        raise read.error(c + "tls.enabled", "expected true when tls files are set, got false")
    return StoreAccess(username, password, _tls(read, c + "tls.", enabled=enabled))


def _optional_text(read: Reader, key: str) -> str | None:
    return None if read.raw(key) is None else read.text(key, r"\S+", "null or a name")


_TLS_FILES = ("ca-file", "cert-file", "key-file")


def _tls_files_given(read: Reader, t: str) -> bool:
    return any(read.raw(t + name) is not None for name in _TLS_FILES)


def _tls(read: Reader, t: str, *, enabled: bool) -> TlsFiles | None:
    """The TLS block under ``t`` (``...tls.``), or None when TLS is off."""
    if not enabled:
        return None
    ca, cert, key = (_pem_file(read, t + name) for name in _TLS_FILES)
    if key is not None and cert is None:
        raise read.error(t + "cert-file", "expected the client certificate of key-file, got null")
    return TlsFiles(ca, cert, key, read.boolean(t + "check-hostname"))


def _pem_file(read: Reader, key: str) -> str | None:
    if read.raw(key) is None:
        return None
    path = read.text(key, expected="null or the path of a PEM file")
    try:
        Path(path).read_bytes()
    except OSError as error:
        raise read.error(key, f"expected a readable PEM file, got {path!r}: "
                         f"{error.strerror or type(error).__name__}") from None
    return path


def cassandra_settings(read: Reader) -> CassandraSettings:
    """``onceflow.stores.cassandra``, with its replication and consistency checked."""
    c = "onceflow.stores.cassandra."
    version = read.integer(c + "protocol-version", 0, 5)
    if version in (1, 2):
        raise read.error(
            c + "protocol-version",
            f"expected 0 (let the driver negotiate) or 3..5, got {version}",
        )
    local_dc = read.raw(c + "local-datacenter")
    settings = CassandraSettings(
        contact_points=_hosts(read, c + "contact-points"),
        port=read.integer(c + "port", 1, 65535),
        keyspace=read.text(c + "keyspace", _KEYSPACE, _KEYSPACE_HINT),
        replication=_replication(read, c + "replication."),
        protocol_version=version,
        local_datacenter=None if local_dc is None else read.text(
            c + "local-datacenter", _DATACENTER, "null or a datacenter name"
        ),
        consistency=read.text(
            c + "consistency", "|".join(_CONSISTENCY),
            "one of " + ", ".join(repr(level) for level in _CONSISTENCY),
        ),
        connect_timeout=read.duration(c + "connect-timeout", 0.1, 300),
        request_timeout=read.duration(c + "request-timeout", 0.1, 600),
        concurrency=read.integer(c + "concurrency", 1, 1024),
        access=_cassandra_access(read, c),
    )
    _check_datacenter(read, settings)
    _check_overlap(read, settings)
    return settings


def _hosts(read: Reader, key: str) -> tuple[str, ...]:
    value = read.raw(key)
    hosts = [h.strip() for h in value.split(",")] if isinstance(value, str) else value
    if not (isinstance(hosts, list) and hosts and all(
        isinstance(h, str) and re.fullmatch(_HOST, h) for h in hosts
    )):
        raise read.error(key, f"expected {_HOSTS_HINT}, got {show(value) if value else '[]'}")
    return tuple(hosts)


def _replication(read: Reader, r: str) -> CassandraReplication:
    strategy = cast(ReplicationClass, read.text(
        r + "class", "SimpleStrategy|NetworkTopologyStrategy",
        "one of 'SimpleStrategy', 'NetworkTopologyStrategy'",
    ))
    datacenters = read.raw(r + "datacenters")
    if strategy == "SimpleStrategy":
        if datacenters is not None:
            raise read.error(r + "datacenters", "expected null with SimpleStrategy "
                             "(set class = NetworkTopologyStrategy to list datacenters)")
        return CassandraReplication(strategy, read.integer(r + "replication-factor", 1, 100))
    if not isinstance(datacenters, ConfigTree) or not datacenters:
        raise read.error(r + "datacenters", "expected copies per datacenter with "
                         f"NetworkTopologyStrategy, e.g. {{dc1 = 3}}, got {show(datacenters)}")
    factors = []
    for quoted, copies in datacenters.items():
        name = quoted.strip('"')  # pyhocon keeps the quotes of a key holding a dot
        key = f"{r}datacenters.{quoted}"
        if not re.fullmatch(_DATACENTER, name):
            raise read.error(key, f"expected a datacenter name (1-100 of letters, digits, "
                             f"_ . -), got {name!r}")
        if isinstance(copies, bool) or not isinstance(copies, int) or not 1 <= copies <= 100:
            raise read.error(key, f"expected an integer in 1..100, got {show(copies)}")
        factors.append((name, copies))
    return CassandraReplication(strategy, datacenters=tuple(factors))


def _check_datacenter(read: Reader, settings: CassandraSettings) -> None:
    known = dict(settings.replication.datacenters)
    local = settings.local_datacenter
    if local is not None and known and local not in known:
        raise read.error(
            "onceflow.stores.cassandra.local-datacenter",
            f"expected one of the replication datacenters ({', '.join(known)}), got {local!r}",
        )


def _check_overlap(read: Reader, settings: CassandraSettings) -> None:
    """Refuse a level whose reads could miss an acknowledged write (R + W <= RF).

    A load that misses the latest write of a state would fold events into a
    stale state after a rebalance: the events in between are lost.
    """
    level = settings.consistency
    needed = _FIXED_REPLICAS.get(level)
    if needed is None:
        return
    replication = settings.replication
    per_dc = dict(replication.datacenters)
    if replication.replication_factor is not None:
        copies = replication.replication_factor
    elif level == "LOCAL_ONE":
        copies = per_dc.get(settings.local_datacenter or "", max(per_dc.values()))
    else:
        copies = sum(per_dc.values())
    if needed > copies:
        problem = f"{level} needs {needed} replicas, the replication has {copies}"
    elif 2 * needed <= copies:
        problem = f"{level} reads can miss {level} writes with {copies} replicas"
    else:
        return
    raise read.error(
        "onceflow.stores.cassandra.consistency",
        f"expected QUORUM, LOCAL_QUORUM or ALL: {problem}, got {level!r}",
    )
