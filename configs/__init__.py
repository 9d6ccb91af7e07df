"""The configs folder as the package flight_overlord.demo.configs, so a wheel ships demo.yaml.

pyproject.toml maps this folder into the package (only demo.yaml ships, `overlord demo`'s default);
this file makes it a regular package, which setuptools' editable install needs to find it.
"""
