"""No secret ever appears in what onceflow writes: config errors, DEBUG logs, /health,
/metrics, ``onceflow status``, dead-letter records.

A worker runs over mutual TLS with an encrypted client key (its password is a
secret) at DEBUG level, dead-letters a record, is asked for its health and
metrics, and is stopped; bad configurations holding the secrets are refused.
Everything they wrote is searched for every secret value.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tls_broker import TlsBroker, tls_broker

from onceflow.devtools import harness, services
from onceflow.devtools.robot_stream import generate
from onceflow.devtools.services import ServiceInfo

KEY_PASSWORD = f"kp-{secrets.token_hex(8)}"
WRONG_PASSWORD = f"wrong-{secrets.token_hex(8)}"
SASL_PASSWORD = f"sp-{secrets.token_hex(8)}"
SECRETS = (KEY_PASSWORD, WRONG_PASSWORD, SASL_PASSWORD)
K = "onceflow.kafka."


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_broker(tmp_path, client_key_password=KEY_PASSWORD) as b:
        yield b


def onceflow(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_KAFKA")}
    return subprocess.run([sys.executable, "-m", "onceflow", *args], capture_output=True,
                          text=True, env={**environment, **(env or {})}, timeout=60,
                          check=False)


def config_errors(broker: TlsBroker, tmp_path: Path) -> list[str]:
    """Each bad configuration holding a secret: exit 2 and a config error line."""
    tls = [a for key, value in broker.worker_settings().items()
           for a in ("--set", f'{key}="{value}"')]
    conf = tmp_path / "bad.conf"
    wrong = tmp_path / "wrong-password"
    wrong.write_text(WRONG_PASSWORD)
    cases: list[tuple[str, list[str], dict[str, str]]] = [
        ("", [*tls, "--set", f"{K}ssl.key-password={KEY_PASSWORD}"], {}),
        ("", [*tls, "--set", f"{K}ssl.key-password=a:1,{KEY_PASSWORD}"], {}),
        ("", [*tls, "--set", f"{K}sasl.password={{{SASL_PASSWORD}"], {}),
        ("", [*tls, "--set", f'{K}ssl.key-password-file="{wrong}"'], {}),
        ("", [], {"ONCEFLOW_KAFKA_SASL_PASSWORD": SASL_PASSWORD}),  # PLAINTEXT: refused
        (f"{K}security-protocol = SASL_SSL\n{K}sasl.password = {SASL_PASSWORD}\n", [], {}),
        (f'{K}sasl {{ password = "{SASL_PASSWORD}", username = 42 }}\n'
         f"{K}security-protocol = SASL_PLAINTEXT\n", [], {}),
    ]
    outputs = []
    for text, args, env in cases:
        conf.write_text('onceflow.pipeline = "onceflow.examples.robots:pipeline"\n' + text)
        done = onceflow("-v", "run", "-c", str(conf), *args, env=env)
        assert done.returncode == 2 and "config error" in done.stderr, (args, done.stderr)
        outputs.append(done.stdout + done.stderr)
    return outputs


def test_no_output_shows_a_secret(
    broker: TlsBroker, redis_service: ServiceInfo, tmp_path: Path,
    unique_name: Callable[..., str],
) -> None:
    written = config_errors(broker, tmp_path)
    topic, dead, group = unique_name("robots"), unique_name("dlq"), unique_name("g")
    security = broker.security()
    for name in (topic, dead):
        asyncio.run(harness.create_topic(broker.bootstrap, name, 1, security))
    stream = generate(2_000, robots=20, seed=9).messages
    bad = (b"robot-0001", b"not JSON")
    ends = asyncio.run(harness.produce(broker.bootstrap, topic, [*stream[:100], bad,
                                                                 *stream[100:]],
                                       security=security))
    password_file = tmp_path / "key-password"
    password_file.write_text(KEY_PASSWORD + "\n")
    port = services.free_port()
    settings = {**broker.worker_settings(), f"{K}ssl.key-password-file": str(password_file),
                f"{K}group-id": group, f"{K}dead-letter-topic": dead,
                "onceflow.stores.redis.url": f"redis://{redis_service.address}/0",
                "onceflow.stores.redis.key-prefix": unique_name("p"),
                "onceflow.metrics.port": str(port)}
    argv = harness.worker_command(harness.packaged_config("demo.conf"), settings)
    argv.insert(argv.index("run"), "-v")  # DEBUG: aiokafka logs every request and response
    worker = harness.WorkerProcess(argv, {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic},
                                   tmp_path)
    worker.start()
    try:
        async def drained() -> bool:
            async with harness.CommittedOffsets(broker.bootstrap, group, security) as offsets:
                return await offsets.wait_for(topic, ends, 120, worker)

        assert asyncio.run(drained()), f"see {worker.logs[-1]}"
        for path in ("/health", "/metrics"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                written.append(reply.read().decode())
        status = onceflow("status", "--url", f"http://127.0.0.1:{port}")
        assert status.returncode == 0 and '"healthy": true' in status.stdout, status.stderr
        written.append(status.stdout + status.stderr)
        assert worker.terminate(10) == 0
    finally:
        if worker.exited() is None:
            worker.kill()
    letters = asyncio.run(harness.read_all(broker.bootstrap, dead, 1, security=security))
    assert [r.value for r in letters] == [bad[1]]
    written += [repr(r.headers) + repr(r.key) for r in letters]
    log = worker.logs[-1].read_text()
    assert " DEBUG aiokafka" in log and "SSL" in log  # the log did see the TLS clients at work
    written.append(log)
    for secret in SECRETS:
        leaks = [text for text in written if secret in text]
        assert not leaks, f"{secret!r} leaked in {len(leaks)} outputs: {leaks[0][-2000:]}"
