"""Secret settings: from a file or the config file (env substitution), never from --set,
and never shown by repr, str or an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyhocon import ConfigFactory

from onceflow.runtime.config_reader import OVERRIDES, ConfigError, Reader
from onceflow.runtime.secrets import Secret, read_secret

KEY = "onceflow.stores.redis.password"


def reader(text: str, origin: str = "app.conf") -> Reader:
    return Reader(ConfigFactory.parse_string(text), lambda key: origin)


def test_a_secret_from_the_config_file_is_wrapped_and_never_printed() -> None:
    secret = read_secret(reader(f'{KEY} = "s3cr3t-value"'), KEY)
    assert secret is not None and secret.reveal() == "s3cr3t-value"
    assert "s3cr3t" not in repr(secret) + str(secret) + f"{secret}" + repr([secret])


def test_a_secret_from_a_file_drops_the_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-a-file\n")
    assert read_secret(reader(f'{KEY}-file = "{tmp_path / "pw"}"'), KEY) == Secret("from-a-file")


def test_no_secret_set_is_none() -> None:
    assert read_secret(reader("a = 1"), KEY) is None


def test_a_secret_on_the_command_line_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        read_secret(reader(f'{KEY} = "on-the-cli"', origin=OVERRIDES), KEY)
    assert "command line" in str(caught.value) and "on-the-cli" not in str(caught.value)


@pytest.mark.parametrize("content", ["", "\n"])
def test_an_empty_or_missing_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "pw").write_text(content)
    for path in (tmp_path / "pw", tmp_path / "absent"):
        with pytest.raises(ConfigError, match=f"{KEY}-file"):
            read_secret(reader(f'{KEY}-file = "{path}"'), KEY)


def test_both_ways_at_once_is_an_error() -> None:
    with pytest.raises(ConfigError, match="not both"):
        read_secret(reader(f'{KEY} = "x"\n{KEY}-file = "/tmp/x"'), KEY)
