"""The repository's data folders (``schemas/``, ``configs/``) as the code reads them.

pyproject.toml maps each folder onto a package (``flight_overlord.wire.schema_files``, ...), so an installed
wheel and an editable install find them by the package's name. A checkout used without installing (the
repository root on ``PYTHONPATH``, say on a GPU machine whose Python already holds torch) has no such
package: the folder beside ``flight_overlord/`` is read instead.
"""
from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def data_folder(package: str, folder: str) -> Traversable:
    """``package``'s files when installed, else the checkout's ``folder``."""
    try:
        return files(package)
    except ModuleNotFoundError:
        if (CHECKOUT / folder).is_dir():
            return CHECKOUT / folder
        raise
