/*
 * The kernel table (generated from ops.def) and the two helpers every
 * kernel uses: work splitting and data errors.  (Per-thread scratch sizes
 * are part of the compiled program: compile_scratch_bytes.)
 * The kernels themselves live in kernels_<family>.c.
 */
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/kernels_ops.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

/* Leaves are placed by the executor; kern_for hides this entry. */
void kern_leaf(const kern_args *args) { (void)args; }

static const kern_fn kernel_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) kern,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof kernel_table / sizeof kernel_table[0] == IR_OP_COUNT,
               "kernel table out of step with ops.def");

kern_fn kern_for(ir_op op)
{
    if ((unsigned)op >= (unsigned)IR_OP_COUNT) return NULL;
    kern_fn fn = kernel_table[op];
    return fn == kern_leaf ? NULL : fn;
}

/* Only the first failure of a step keeps its status and message: the
 * winner of the compare-exchange writes the shared buffer, which the
 * executor reads after the pool has finished (so no one else touches it
 * meanwhile).  The thread-local message is set too, for callers that run a
 * kernel directly. */
void kern_fail(const kern_args *a, spmd_status status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (a->status) {
        int expected = SPMD_OK;
        if (!atomic_compare_exchange_strong(a->status, &expected, (int)status)) return;
    }
    if (a->message && a->message_size > 0) snprintf(a->message, a->message_size, "%s", msg);
    base_error(status, "%s", msg);
}

void kern_split(int64_t n, int ith, int nth, int64_t align, int64_t *begin, int64_t *end)
{
    if (align < 1) align = 1;
    if (nth < 1) nth = 1;
    if (n <= 0) {
        *begin = *end = 0;
        return;
    }
    /* Blocks of `align` items, spread as evenly as possible: the first
     * (blocks % nth) threads take one block more. */
    int64_t blocks = kn_ceil_div(n, align);
    int64_t per = blocks / nth, extra = blocks % nth;
    int64_t b = per * ith + kn_min(ith, extra);
    int64_t e = b + per + (ith < extra ? 1 : 0);
    *begin = kn_min(b * align, n);
    *end = kn_min(e * align, n);
}
