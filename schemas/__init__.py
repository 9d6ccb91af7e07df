"""The wire schemas (JSON, their single source of truth) as the package flight_overlord.wire.schema_files.

pyproject.toml maps this folder into the package so installs ship it; this file makes it a regular
package, which setuptools' editable install needs to find it. flight_overlord/wire/schemas.py reads it.
"""
