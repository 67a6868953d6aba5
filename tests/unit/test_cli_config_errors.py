"""`onceflow run` with bad configuration: exit code 2 and one precise message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD_PIPELINE = 'onceflow.pipeline = "onceflow.examples.robots:pipeline"\n'
KAFKA_TOPIC = "a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, not '.' or '..')"


def run(tmp_path: Path, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "app.conf"
    conf.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "onceflow", "run", "-c", str(conf), *extra],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka { bootstrap-servers = [\n",
            "app.conf: line 3, column 1: syntax error: Expected ']'",
            id="syntax-error",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka.sesion-timeout = 10s\n",
            "app.conf: onceflow.kafka.sesion-timeout: unknown key "
            "(did you mean 'session-timeout'?)",
            id="unknown-key",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka.session-timeout = soon\n",
            "app.conf: onceflow.kafka.session-timeout: expected a duration",
            id="wrong-type",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.consumer.max-in-flight-batches = 0\n",
            "app.conf: onceflow.consumer.max-in-flight-batches: expected an integer in 1..1000, "
            "got 0",
            id="out-of-range",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka.consumer.isolation-level = committed\n",
            "app.conf: onceflow.kafka.consumer.isolation-level: expected one of "
            "'read_committed', 'read_uncommitted', got 'committed'",
            id="isolation-level",
        ),
        pytest.param(
            "onceflow.kafka.group-id = g\n",
            "app.conf: onceflow.pipeline: missing",
            id="missing-pipeline",
        ),
        pytest.param(
            'onceflow.pipeline = "no_such_module:pipeline"\n',
            "app.conf: onceflow.pipeline: expected 'module:attribute' naming a Pipeline; "
            "cannot load 'no_such_module:pipeline': ModuleNotFoundError",
            id="pipeline-not-importable",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.robots:__doc__"\n',
            "app.conf: onceflow.pipeline: expected a onceflow.stages.Pipeline or a factory "
            "returning one, 'onceflow.examples.robots:__doc__' is a str",
            id="pipeline-wrong-kind",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.robots:new_counts"\n',
            "app.conf: onceflow.pipeline: expected 'onceflow.examples.robots:new_counts' to "
            "return a onceflow.stages.Pipeline, got a dict",
            id="factory-returns-something-else",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.orders:build"\n'
            "onceflow.pipeline-settings { topic = orders, colour = red }\n",
            "app.conf: onceflow.pipeline-settings: onceflow.examples.orders:build with "
            "{'topic': 'orders', 'colour': 'red'} failed: TypeError: build() got an unexpected "
            "keyword argument 'colour'",
            id="factory-refuses-a-setting",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.pipeline-settings { topic = orders }\n",
            "app.conf: onceflow.pipeline-settings: expected none: "
            "'onceflow.examples.robots:pipeline' is a Pipeline",
            id="settings-for-a-pipeline",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.orders:build"\n'
            "onceflow.pipeline-settings = orders\n",
            "app.conf: onceflow.pipeline-settings: expected an object of factory arguments, "
            "got 'orders'",
            id="settings-not-an-object",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.orders:build"\n'
            "onceflow.pipeline-settings { topic = orders raw }\n",
            "app.conf: onceflow.pipeline-settings.topic: expected " + KAFKA_TOPIC
            + ", got 'orders raw' (pipeline 'orders': source topic)",
            id="source-topic-with-a-space",
        ),
        pytest.param(
            'onceflow.pipeline = "onceflow.examples.orders:build"\n'
            'onceflow.pipeline-settings { repartition-topic = "orders/by-customer" }\n',
            "app.conf: onceflow.pipeline-settings.repartition-topic: expected " + KAFKA_TOPIC
            + ", got 'orders/by-customer' (pipeline 'orders': repartition 'by_customer' topic)",
            id="repartition-topic-kafka-refuses",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka.dead-letter-topic = payments dead\n",
            "app.conf: onceflow.kafka.dead-letter-topic: expected " + KAFKA_TOPIC
            + ", got 'payments dead'",
            id="dead-letter-topic-with-a-space",
        ),
        pytest.param(
            GOOD_PIPELINE + "onceflow.kafka.late-events-topic = z\u00e4hler\n",
            "app.conf: onceflow.kafka.late-events-topic: expected " + KAFKA_TOPIC
            + ", got 'z\u00e4hler'",
            id="late-events-topic-not-ascii",
        ),
        pytest.param(
            GOOD_PIPELINE + 'onceflow.kafka.late-events-topic = ".."\n',
            "app.conf: onceflow.kafka.late-events-topic: expected " + KAFKA_TOPIC + ", got '..'",
            id="late-events-topic-dots",
        ),
    ],
)
def test_bad_config_exits_2_with_file_key_and_expectation(
    tmp_path: Path, text: str, expected: str
) -> None:
    result = run(tmp_path, text)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("onceflow: config error: ")
    assert expected in lines[0].replace(str(tmp_path) + "/", "")


def test_missing_file_exits_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "run", "-c", str(tmp_path / "nope.conf")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().endswith("nope.conf: file not found")


def test_bad_override_exits_2(tmp_path: Path) -> None:
    result = run(tmp_path, GOOD_PIPELINE, "--set", "onceflow.commit.interval=forever")
    assert result.returncode == 2
    assert "onceflow.commit.interval: expected a duration" in result.stderr


def test_dedup_without_a_store_exits_2_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "stateless_dedup.py").write_text(
        "from onceflow import Pipeline, ProducerDedup\n"
        "pipeline = Pipeline('fwd', topics=('in',), format='json',\n"
        "    dedup=ProducerDedup(producer='pid', sequence='seq')).republish(\n"
        "    'out', 'out', encode=bytes)\n")
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "stateless_dedup:pipeline"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "onceflow", "run", "-c", str(conf)],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert ("app.conf: onceflow.pipeline: pipeline 'fwd': dedup= needs a store for the producer "
            "sequences and the pipeline has no aggregate: name one with "
            "ProducerDedup(..., store='redis')") in result.stderr.replace(str(tmp_path) + "/", "")


def test_a_topic_name_kafka_refuses_in_the_pipeline_module_exits_2(tmp_path: Path) -> None:
    (tmp_path / "spaced.py").write_text(
        "from onceflow import Pipeline\n"
        "pipeline = Pipeline('fwd', topics=('in',), format='json').republish(\n"
        "    'out', 'payments out')\n")
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "spaced:pipeline"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    result = subprocess.run([sys.executable, "-m", "onceflow", "run", "-c", str(conf),
                             "--app-dir", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert (f"onceflow: config error: {conf}: onceflow.pipeline: expected {KAFKA_TOPIC}, got "
            "'payments out' (pipeline 'fwd': republish 'out' topic)") in result.stderr


def test_a_group_id_with_whitespace_is_warned_of_at_start_naming_file_key_and_value(
        tmp_path: Path) -> None:
    """Kafka accepts it (a deployment may have offsets under it), so only a warning: an
    unquoted ``payments agg`` would start a new group over the same states."""
    result = run(tmp_path, 'onceflow.pipeline = "no_such_module:pipeline"\n'
                           "onceflow.kafka.group-id = payments agg\n")
    assert result.returncode == 2  # the missing module; the warning came first
    warning, error = [line for line in result.stderr.splitlines() if line.strip()]
    assert "WARNING" in warning
    assert (f"config: {tmp_path}/app.conf: onceflow.kafka.group-id: the group id 'payments agg' "
            "holds whitespace (an unquoted HOCON value keeps the spaces between its words)"
            ) in warning
    assert error.startswith("onceflow: config error: ")
    quoted = run(tmp_path, 'onceflow.pipeline = "no_such_module:pipeline"\n'
                           'onceflow.kafka.group-id = "payments-agg"\n')
    assert "WARNING" not in quoted.stderr and quoted.returncode == 2
