/* Failures as Python exceptions (core.h). */
#include "core.h"

#include <string.h>

/* The exception for a status: bad input of any kind is a ValueError (as
 * Python's own functions raise for a value they cannot take), then
 * MemoryError, OSError for files, RuntimeError for the rest (a missing
 * BLAS, a broken invariant).  The exception carries spmd_last_error() and,
 * as `status`, the status's name. */
PyObject *raise_status(spmd_status st)
{
    PyObject *type;
    switch (st) {
    case SPMD_ERR_INVALID:
    case SPMD_ERR_SHAPE:
    case SPMD_ERR_UNSUPPORTED: type = PyExc_ValueError; break;
    case SPMD_ERR_NOMEM: type = PyExc_MemoryError; break;
    case SPMD_ERR_IO: type = PyExc_OSError; break;
    case SPMD_ERR_TIMEOUT: type = PyExc_TimeoutError; break;
    default: type = PyExc_RuntimeError; break;
    }
    const char *msg = spmd_last_error();
    if (st == SPMD_OK) msg = "libspmd returned no result and recorded no failure";
    else if (!msg[0]) msg = spmd_status_name(st);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    PyObject *exc = text ? PyObject_CallOneArg(type, text) : NULL;
    Py_XDECREF(text);
    if (!exc) return NULL;
    PyObject *name = PyUnicode_FromString(spmd_status_name(st));
    if (name) PyObject_SetAttrString(exc, "status", name);
    Py_XDECREF(name);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *raise_last(void) { return raise_status(spmd_last_status()); }

int check(spmd_status st)
{
    if (st == SPMD_OK) return 0;
    raise_status(st);
    return -1;
}
