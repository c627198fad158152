"""An extension module that cannot be loaded for want of a system library
raises an ImportError naming the library and the Debian package to
install (libspmd/_system_libraries.py), from the dynamic loader's own
message: here the loader's words for a library that is not there, got
by asking it for one no system has (libmpi.so.999 and the like)."""
import ctypes

import pytest

from libspmd._system_libraries import explain_import_error


def loader_message(library):
    """What the dynamic loader says when `library` cannot be found."""
    with pytest.raises(OSError) as failed:
        ctypes.CDLL(library)
    return str(failed.value)


@pytest.mark.parametrize("library, package", [
    ("libmpi.so.999", "libopenmpi3 (Debian 12) or libopenmpi40 (Debian 13)"),
    ("libopen-pal.so.999", "libopenmpi3 (Debian 12) or libopenmpi40 (Debian 13)"),
    ("libcjson.so.999", "libcjson1"),
    ("libz.so.999", "zlib1g"),
])
def test_a_missing_system_library_names_its_package(library, package):
    explained = explain_import_error(ImportError(loader_message(library)))
    assert isinstance(explained, ImportError)
    assert f"{library} (" in str(explained)
    assert f"apt-get install {package}" in str(explained)


def test_a_missing_libspmd_says_reinstall():
    explained = explain_import_error(ImportError(loader_message("libspmd.so.999")))
    assert "libspmd.so.999, which is installed beside it, is missing: reinstall libspmd" in str(explained)


def test_an_unknown_library_is_still_named():
    explained = explain_import_error(ImportError(loader_message("libnothing-here.so.1")))
    assert "libnothing-here.so.1 is not installed" in str(explained)


def test_other_import_errors_are_left_alone():
    assert explain_import_error(ImportError("cannot import name '_core' from 'libspmd'")) is None
