"""The package list only; everything else is in pyproject.toml.

Packages are discovered (a hand-written list once left trainer_core.export out of the wheel). One package cannot be
discovered: the built-in presets live in presets/ at the repository root (easy to find and edit) and install as
trainer_core.builtin_presets (package-dir and package-data in pyproject.toml). pyproject's
[tool.setuptools.packages.find] only finds packages inside the searched folders and cannot be combined with a
listed package, so the list is computed here. scripts/check_wheel.py (run by CI) proves the wheel is complete.
"""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["trainer_core*", "db*", "ui*", "gateway*"]) + ["trainer_core.builtin_presets"])
