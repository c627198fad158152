"""The system libraries libspmd's extension module needs to load, and the
Debian packages that provide them: an extension module that the dynamic
loader cannot load for want of one raises an ImportError naming the
library and the package to install, instead of the loader's bare message.

The module and libspmd.so.0 link Open MPI's libmpi (when built with
MPI), cJSON and zlib; OpenBLAS and oneDNN are loaded later, when a
program first runs (a missing OpenBLAS is a BackendError naming its
package then; without oneDNN bf16 products convert to f32).
"""
import re

# By the start of the file name the loader reports missing: what the
# library is, and the Debian package with it (Debian 12, Debian 13).
_PACKAGES = (
    ("libmpi.", "Open MPI's library", "libopenmpi3 (Debian 12) or libopenmpi40 (Debian 13)"),
    ("libopen-", "Open MPI's library", "libopenmpi3 (Debian 12) or libopenmpi40 (Debian 13)"),
    ("libcjson.", "cJSON", "libcjson1"),
    ("libz.", "zlib", "zlib1g"),
)

_MISSING = re.compile(r"(lib[\w+.-]*\.so[\w.]*): cannot open shared object file")


def explain_import_error(error):
    """An ImportError saying which library is missing and the package to
    install, for the ImportError of loading the extension module; None
    when the loader did not say that a library is missing."""
    found = _MISSING.search(str(error))
    if not found:
        return None
    library = found.group(1)
    if library.startswith("libspmd."):
        return ImportError(f"libspmd cannot load its extension module: {library}, which is installed "
                           f"beside it, is missing: reinstall libspmd ({error})")
    for prefix, what, package in _PACKAGES:
        if library.startswith(prefix):
            return ImportError(f"libspmd cannot load its extension module: {library} ({what}) is "
                               f"not installed: apt-get install {package} ({error})")
    return ImportError(f"libspmd cannot load its extension module: {library} is not installed "
                       f"({error})")
