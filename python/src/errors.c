/* Failures as Python exceptions (core.h): the classes of libspmd.errors,
 * one per status of the C library. */
#include "core.h"

#include <string.h>

/* Each status's class in libspmd.errors (which documents the hierarchy);
 * a status not listed, a broken invariant, is an InternalError. */
static const struct {
    spmd_status status;
    const char *name;
} classes[] = {
    {SPMD_ERR_INVALID, "InvalidError"},       {SPMD_ERR_SHAPE, "ShapeError"},
    {SPMD_ERR_NOMEM, "OutOfMemoryError"},     {SPMD_ERR_IO, "FileError"},
    {SPMD_ERR_UNSUPPORTED, "UnsupportedError"}, {SPMD_ERR_BACKEND, "BackendError"},
    {SPMD_ERR_INTERNAL, "InternalError"},     {SPMD_ERR_TIMEOUT, "CollectiveTimeoutError"},
};
#define N_CLASSES (sizeof classes / sizeof classes[0])

static PyObject *types[N_CLASSES]; /* the classes, in the order of `classes` */

PyObject *error_type(spmd_status st)
{
    size_t internal = 0;
    for (size_t i = 0; i < N_CLASSES; i++) {
        if (classes[i].status == st) return types[i];
        if (classes[i].status == SPMD_ERR_INTERNAL) internal = i;
    }
    return types[internal];
}

PyObject *raise_status(spmd_status st)
{
    PyObject *type = error_type(st);
    const char *msg = spmd_last_error();
    if (st == SPMD_OK) msg = "libspmd returned no result and recorded no failure";
    else if (!msg[0]) msg = spmd_status_name(st);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    PyObject *exc = text ? PyObject_CallOneArg(type, text) : NULL;
    Py_XDECREF(text);
    if (!exc) return NULL;
    /* The status itself, which its class's `status` names too, but for
     * SPMD_OK (an InternalError). */
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

int errors_register(PyObject *mod)
{
    (void)mod;
    PyObject *errors = PyImport_ImportModule("libspmd.errors");
    if (!errors) return -1;
    int rc = 0;
    for (size_t i = 0; i < N_CLASSES && !rc; i++) {
        Py_CLEAR(types[i]);
        types[i] = PyObject_GetAttrString(errors, classes[i].name);
        PyObject *name = types[i] ? PyUnicode_FromString(spmd_status_name(classes[i].status)) : NULL;
        rc = name && PyObject_SetAttrString(types[i], "status", name) == 0 ? 0 : -1;
        Py_XDECREF(name);
    }
    Py_DECREF(errors);
    return rc;
}
