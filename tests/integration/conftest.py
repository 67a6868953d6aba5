"""Integration tests import their shared helpers from this folder; the stores that want
a login and TLS are started here, once per session, for the tests that use them."""

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import SecureService  # importable once the folder is on the path

from onceflow.devtools import services
from onceflow.devtools.certs import LocalPki, make_pki


@pytest.fixture(scope="session")
def store_pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, for the stores."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def secure_redis_service(tmp_path_factory: pytest.TempPathFactory, store_pki: LocalPki
                         ) -> Iterator[SecureService]:
    """A private Redis on TLS only (client certificates required) with requirepass."""
    admin = "admin-" + uuid.uuid4().hex
    info = services.start_redis(tmp_path_factory.mktemp("redis-secure"), password=admin,
                                tls=store_pki)
    try:
        yield SecureService(info, store_pki, (None, admin))
    finally:
        services.stop(info)


@pytest.fixture(scope="session")
def secure_cassandra_service(tmp_path_factory: pytest.TempPathFactory, store_pki: LocalPki
                             ) -> Iterator[SecureService]:
    """A private Cassandra 2.1 with PasswordAuthenticator and client-to-node TLS (~600 MB:
    one per session)."""
    info = services.start_cassandra(tmp_path_factory.mktemp("cassandra-secure"),
                                    password_auth=True, tls=store_pki)
    try:
        yield SecureService(info, store_pki, services.CASSANDRA_SUPERUSER)
    finally:
        services.stop(info)
