"""Only the package list; everything else is in pyproject.toml.

pyproject's ``packages`` is either a list or a find directive, not both: every package under
flight_overlord/ is found (namespace packages too), and the two repository folders that
pyproject's ``package-dir`` maps into the package are added by name.
"""
from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["flight_overlord", "flight_overlord.*"], exclude=["*.__pycache__"])
      + ["flight_overlord.wire.schema_files", "flight_overlord.demo.configs"])
