"""The optional C extension (`tailguard._speedups`, the relay's per-chunk hot loop); everything
else is in pyproject.toml. `optional=True`: where it cannot be built (no compiler), the install
still succeeds and the pure-Python code runs instead, as aiohttp's, yarl's and msgpack's do."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tailguard._speedups", ["src/tailguard/_speedups.c"], optional=True)])
