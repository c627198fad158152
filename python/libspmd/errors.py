"""The exceptions libspmd raises, from the C library and from Python alike.

Every one is a libspmd.Error, and also the built-in exception a caller
would catch for its kind, so `except ValueError` (bad input) or `except
NotImplementedError` (what libspmd cannot do) written before these
classes existed still catches what it caught:

    Error                                       every failure below
      InvalidError      (ValueError)            SPMD_ERR_INVALID: a bad argument or value
        ShapeError                              SPMD_ERR_SHAPE: shapes that do not fit
      UnsupportedError  (NotImplementedError,   SPMD_ERR_UNSUPPORTED, and an aten op or
                         ValueError)            option libspmd.torch does not map
      OutOfMemoryError  (MemoryError)           SPMD_ERR_NOMEM
      FileError         (OSError)               SPMD_ERR_IO
      BackendError      (RuntimeError)          SPMD_ERR_BACKEND: the BLAS, MPI
      InternalError     (RuntimeError)          SPMD_ERR_INTERNAL: a libspmd bug
      CollectiveTimeoutError (TimeoutError)     SPMD_ERR_TIMEOUT: the collective watchdog

The C extension raises the class of the library's status (its table is
python/src/errors.c) with spmd_last_error() as the message, and gives
each class its status's name as `status` ("shape mismatch", ...).
UnsupportedError is a ValueError too because the C library's refusals
were ValueErrors before it existed.  This module imports nothing, so any
part of the package may raise these.
"""


class Error(Exception):
    """A failure of libspmd.  `status` is the C library's status name
    (spmd_status_name) of the class's kind; None for this base."""

    status = None


class InvalidError(Error, ValueError):
    """A bad argument or value: a spec naming no axis, an unknown name, an
    array of another dtype, a closed handle (SPMD_ERR_INVALID)."""


class ShapeError(InvalidError):
    """Shapes that do not fit the op or the tensor (SPMD_ERR_SHAPE)."""


class UnsupportedError(Error, NotImplementedError, ValueError):
    """A valid request libspmd cannot do: a dtype or op the library refuses
    (SPMD_ERR_UNSUPPORTED), an aten op or option libspmd.torch does not
    map, a build without MPI asked to use it."""


class OutOfMemoryError(Error, MemoryError):
    """An allocation failed (SPMD_ERR_NOMEM)."""


class FileError(Error, OSError):
    """A file could not be read or written (SPMD_ERR_IO)."""


class BackendError(Error, RuntimeError):
    """The BLAS or another backend (MPI) is missing or failed
    (SPMD_ERR_BACKEND)."""


class InternalError(Error, RuntimeError):
    """A broken invariant: a libspmd bug (SPMD_ERR_INTERNAL)."""


class CollectiveTimeoutError(Error, TimeoutError):
    """A collective made no progress for its timeout
    (compile(collective_timeout=S); SPMD_ERR_TIMEOUT)."""
