"""``--job module:function``: the function is imported, and a bad spec says what is wrong."""

from __future__ import annotations

import pytest

from onceflow.analytics.user_job import load_job


def test_load_job_imports_the_function() -> None:
    from onceflow.examples.robots_report import report

    assert load_job("onceflow.examples.robots_report:report") is report


@pytest.mark.parametrize(("spec", "message"), [
    ("onceflow.examples.robots_report", "--job expects module:function, got "
                                        "'onceflow.examples.robots_report'"),
    (":report", "--job expects module:function, got ':report'"),
    ("onceflow.examples.robots_report:nothing",
     "--job onceflow.examples.robots_report:nothing: module 'onceflow.examples.robots_report' "
     "has no function 'nothing'"),
    ("onceflow.examples.robots_report:HOUR_MS",
     "--job onceflow.examples.robots_report:HOUR_MS: module 'onceflow.examples.robots_report' "
     "has no function 'HOUR_MS'"),
    ("no_such_module_xyz:job",
     "--job no_such_module_xyz:job: cannot import 'no_such_module_xyz': "
     "No module named 'no_such_module_xyz'; looked in the import path and the installed "
     "packages: run onceflow from the directory that holds no_such_module_xyz/ or "
     "no_such_module_xyz.py, pass --app-dir DIR, or install your package into this "
     "environment"),
])
def test_a_bad_job_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        load_job(spec)
    assert str(error.value) == message
