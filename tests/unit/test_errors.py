"""One root error type: every error the package raises on purpose is an OverlordError and still the
builtin it always was, so both ``except OverlordError`` and older handlers catch it."""
from __future__ import annotations

import pytest

from flight_overlord.config import ConfigError
from flight_overlord.constructor.assembly import BadSample
from flight_overlord.core.vision import ImageError
from flight_overlord.errors import BackgroundFailure, OverlordError
from flight_overlord.source_files import StorageError
from flight_overlord.wire.security import SecurityError
from flight_overlord.wire.server import RoleDown


@pytest.mark.parametrize("cls, builtin", [(ConfigError, ValueError), (SecurityError, ValueError),
                                          (BadSample, RuntimeError), (ImageError, ValueError),
                                          (StorageError, OSError), (RoleDown, ConnectionError)])
def test_every_error_is_an_overlord_error_and_its_builtin(cls, builtin):
    with pytest.raises(OverlordError, match="what went wrong"):
        raise cls("what went wrong")
    with pytest.raises(builtin):
        raise cls("what went wrong")


def test_a_background_failure_keeps_its_cause():
    cause = KeyError("row group 3")
    failure = BackgroundFailure.of("planning failed", cause)
    assert str(failure) == "planning failed: KeyError: 'row group 3'"
    assert failure.cause is cause and failure.__cause__ is cause and isinstance(failure, RuntimeError)
