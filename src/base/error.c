/* The thread-local error record behind spmd_last_error(). */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_message[1024];
static _Thread_local spmd_status last_status;

spmd_status base_verror(spmd_status status, const char *fmt, va_list ap)
{
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    last_status = status;
    return status;
}

spmd_status base_error(spmd_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    base_verror(status, fmt, ap);
    va_end(ap);
    return status;
}

spmd_status base_error_status(void) { return last_status; }

const char *spmd_last_error(void) { return last_message; }

spmd_status spmd_last_status(void) { return last_status; }

void spmd_clear_error(void)
{
    last_message[0] = '\0';
    last_status = SPMD_OK;
}

const char *spmd_status_name(spmd_status status)
{
    switch (status) {
    case SPMD_OK: return "ok";
    case SPMD_ERR_INVALID: return "invalid argument";
    case SPMD_ERR_SHAPE: return "shape mismatch";
    case SPMD_ERR_NOMEM: return "out of memory";
    case SPMD_ERR_IO: return "i/o error";
    case SPMD_ERR_UNSUPPORTED: return "unsupported";
    case SPMD_ERR_BACKEND: return "backend error";
    case SPMD_ERR_INTERNAL: return "internal error";
    case SPMD_ERR_TIMEOUT: return "timed out";
    }
    return "unknown status";
}
