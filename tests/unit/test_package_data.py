"""``package_data.py``: the data folders found installed, and in a checkout used without installing."""
from __future__ import annotations

import pytest

from flight_overlord.package_data import CHECKOUT, data_folder


def test_an_installed_package_is_found_by_its_name():
    folder = data_folder("flight_overlord.wire.schema_files", "no-such-folder")
    assert (folder / "microbatch.json").is_file()


def test_a_checkout_without_the_package_reads_the_folder_beside_the_code():
    assert data_folder("flight_overlord.no_such_package", "schemas") == CHECKOUT / "schemas"
    with pytest.raises(ModuleNotFoundError):
        data_folder("flight_overlord.no_such_package", "no-such-folder")
