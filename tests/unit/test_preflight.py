"""The start-up topic check's defaults are reference.conf's (the check skips them)."""

from __future__ import annotations

from importlib import resources

from pyhocon import ConfigFactory

from onceflow.runtime.preflight import DEFAULTS


def test_the_unchecked_default_topic_names_are_the_reference_conf_values() -> None:
    text = resources.files("onceflow.runtime").joinpath("reference.conf").read_text("utf-8")
    reference = ConfigFactory.parse_string(text, resolve=False)
    assert {key: reference.get(key) for key in DEFAULTS} == DEFAULTS
