/*
 * Errors: a thread-local record of the last failure, its status and a
 * message that names the cause, set where the error is found and returned
 * through status codes.  IR_ASSERT-style checks for broken invariants
 * report file and line instead of aborting.
 */
#ifndef SPMD_BASE_ERROR_H
#define SPMD_BASE_ERROR_H

#include <stdarg.h>

#include "spmd/spmd.h"

/* Record an error (status and message) and return `status`, so callers
 * can write `return base_error(SPMD_ERR_SHAPE, "...", ...)`. */
spmd_status base_error(spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
spmd_status base_verror(spmd_status status, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* The status of the last error recorded on this thread; SPMD_OK when
 * none was, or after spmd_clear_error. */
spmd_status base_error_status(void);


#define BASE_INTERNAL(msg) \
    base_error(SPMD_ERR_INTERNAL, "internal error at %s:%d: %s", __FILE__, __LINE__, (msg))

#endif
