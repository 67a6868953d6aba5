"""setuptools with the record path compiled by mypyc, as mypy ships itself.

``pyproject.toml`` holds the metadata; this adds the compiled modules that
``onceflow/compiled.py`` lists (none where it says a build here cannot compile:
then the wheel is the pure modules) and the manifest of their sources' hashes,
which the stale-build guard reads.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# By path: importing the package runs the stale-build check that a build exists to satisfy.
spec = importlib.util.spec_from_file_location("onceflow_compiled", "onceflow/compiled.py")
assert spec is not None and spec.loader is not None
compiled = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compiled)


class BuildPy(build_py):
    """Starts from an empty build tree (a kept one would ship deleted modules), but keeps
    this build's compiled extensions, so that an unchanged record path is not compiled again."""

    def run(self) -> None:
        keep = {Path(path).resolve() for path in self.get_finalized_command("build_ext")
                .get_outputs()}
        for path in Path(self.build_lib, "onceflow").rglob("*"):
            if path.is_file() and path.resolve() not in keep:
                path.unlink()
        super().run()


# Commands that only describe the package. pip asks for the metadata in a process of its own
# before it builds, and egg_info finalizes build_ext there (to list the extensions' sources):
# running mypyc then cost a whole type check and C generation (67 s of 3 min) for nothing.
METADATA_ONLY = {"dist_info", "egg_info", "sdist"}


class BuildExt(build_ext):
    """Runs mypyc only when it builds, and writes the manifest beside the compiled modules,
    in the wheel or in place."""

    def finalize_options(self) -> None:
        builds = not set(self.distribution.commands) <= METADATA_ONLY
        if self.distribution.ext_modules and builds:  # the names: now mypyc's C extensions
            self.distribution.ext_modules = compiled.extensions()
        super().finalize_options()

    def run(self) -> None:
        super().run()
        if self.extensions:
            inplace = self.inplace or self.editable_mode
            compiled.write_manifest(Path("onceflow/stages") if inplace else
                                    Path(self.build_lib, "onceflow", "stages"))


pure = compiled.why_pure()
if pure:
    print(f"onceflow: building the pure modules only: {pure}")
# Named here, built by BuildExt: the names make the wheel platform-specific and list its files.
setup(ext_modules=[] if pure else [Extension(name, []) for name in compiled.extension_names()],
      cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
      options={"build": {"build_base": str(compiled.CACHE / "build")}})
