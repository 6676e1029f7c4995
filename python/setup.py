"""Builds libfa4 with CMake from this repository and bundles it in the wheel as fa4/_lib/libfa4.so.

Environment:
  FA4_LIBRARY      bundle this prebuilt libfa4.so instead of building one
  FA4_CMAKE_ARGS   extra CMake configure arguments, e.g. "-DFA4_CUDA=OFF" (default: CMake's own defaults)
  FA4_BUILD_JOBS   parallel build jobs (default: all cores)
An editable install (pip install -e) builds nothing: the package then uses <repo>/build/libfa4.so."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

PYTHON_DIR = pathlib.Path(__file__).resolve().parent
REPO = PYTHON_DIR.parent
CMAKE_LISTS = REPO / "CMakeLists.txt"


def cmake_project_version():
    match = re.search(r"project\(\s*fa4\s+VERSION\s+([0-9.]+)", CMAKE_LISTS.read_text())
    if not match:
        raise RuntimeError(f"fa4: no 'project(fa4 VERSION ...)' in {CMAKE_LISTS}")
    return match.group(1)


class BuildPyWithLibrary(build_py):
    """build_py, then libfa4.so into the package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = pathlib.Path(self.build_lib) / "fa4" / "_lib" / "libfa4.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._library(), target)  # follows the libfa4.so -> libfa4.so.0 -> ... symlinks

    def _library(self):
        prebuilt = os.environ.get("FA4_LIBRARY")
        if prebuilt:
            return pathlib.Path(prebuilt)
        build_temp = self.get_finalized_command("build").build_temp  # python/build/temp.*: kept between installs
        build_dir = pathlib.Path(build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(REPO), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                     "-DFA4_BUILD_TESTS=OFF", *shlex.split(os.environ.get("FA4_CMAKE_ARGS", ""))]
        jobs = os.environ.get("FA4_BUILD_JOBS") or str(os.cpu_count() or 1)
        for command in (configure, ["cmake", "--build", str(build_dir), "--target", "fa4", "-j", jobs]):
            self.announce(" ".join(command), level=2)
            subprocess.run(command, check=True)
        return build_dir / "libfa4.so"


class PlatformWheel(bdist_wheel):
    """The wheel carries a native library but no CPython extension: py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


if not CMAKE_LISTS.exists() and not os.environ.get("FA4_LIBRARY"):
    raise RuntimeError(f"fa4: build from the fa4 repository (no {CMAKE_LISTS}), or set FA4_LIBRARY to a built "
                       f"libfa4.so")

setup(version=cmake_project_version() if CMAKE_LISTS.exists() else "0+unknown",
      cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
