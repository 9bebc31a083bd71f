"""Package discovery for the one namespace ``rollcap`` (the rest of the metadata is in pyproject.toml).

The repository root holds the design card's parts; each installs as a
subpackage of ``rollcap`` (bare names such as ``kernels`` collide on PyPI).
Every package under a part is found here, so a new subpackage cannot be left
out of the wheel (tests/test_wheel.py installs the wheel and runs every command).
"""

from setuptools import find_packages, setup

PARTS = {
    "rollcap": "rollcap",
    "rollcap.kernels": "kernels",
    "rollcap.capsule": "capsule",
    "rollcap.policies": "policies",
    "rollcap.critics": "critics",
    "rollcap.envs": "envs",
    "rollcap.rollout": "rollout",
}

packages = []
for name, where in PARTS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(where)]

setup(packages=packages, package_dir=PARTS)
