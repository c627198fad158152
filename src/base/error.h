/*
 * Errors: a thread-local message that names the cause, set where the error
 * is found and returned through status codes.  IR_ASSERT-style checks for
 * broken invariants report file and line instead of aborting.
 */
#ifndef SPMD_BASE_ERROR_H
#define SPMD_BASE_ERROR_H

#include "spmd/spmd.h"

/* Record an error and return `status`, so callers can write
 * `return base_error(SPMD_ERR_SHAPE, "...", ...)`. */
spmd_status base_error(spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Like base_error, but keeps an earlier message if one is pending: used
 * when a NULL operand from a failed builder call reaches the next op. */
bool base_error_pending(void);

/* For a call that failed and reported through base_error without handing
 * back a status (a graph builder returning NULL): SPMD_ERR_NOMEM when the
 * message is base_alloc's "out of memory", SPMD_ERR_INTERNAL for any other
 * message, and SPMD_OK when there is none, which the caller reports as its
 * own bug (with BASE_INTERNAL, so the message names the caller's line). */
spmd_status base_error_reported(void);

#define BASE_INTERNAL(msg) \
    base_error(SPMD_ERR_INTERNAL, "internal error at %s:%d: %s", __FILE__, __LINE__, (msg))

#endif
