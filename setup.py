"""The build of ``pip install .``: setuptools' (``setup.cfg`` holds the metadata), and then the
kernels compiled on this machine into the built package (``numpy_transformer/compile_kernels.py``
says which, and why the cache holds on the machine it was built on).

An editable install (``pip install -e .``) compiles nothing: its kernels compile on their first
call. A build that cannot compile (Numba missing, say) says so and builds the package all the
same: its kernels, too, compile on their first call.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildAndCompile(build_py):
    """``build_py``, then ``python -m numpy_transformer.compile_kernels`` on the built copy."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        # the built copy first on the path (then pip's build environment, which a path of its
        # own sets up), and Numba's cache beside its kernels
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.abspath(self.build_lib), env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-m", "numpy_transformer.compile_kernels"],
                              env=env, cwd=self.build_lib, check=False)
        if done.returncode:
            print("numpy_transformer: the kernels were not compiled at install; they compile "
                  "on their first call", file=sys.stderr)


setup(cmdclass={"build_py": BuildAndCompile})
