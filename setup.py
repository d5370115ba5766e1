"""Ships configs/ inside the package (addernet/configs/), so an installed copy runs from any directory.

Everything else is in pyproject.toml; addernet.config.config_dir() finds a checkout's configs/ first.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithConfigs(build_py):
    def run(self):
        super().run()
        self.copy_tree("configs", os.path.join(self.build_lib, "addernet", "configs"))


setup(cmdclass={"build_py": BuildWithConfigs})
