/*
 * Data in and out: whole tensors into and out of the devices' blocks
 * (set_input, write, read), and the rows of an input this process's
 * devices read.
 */
#include "runtime/executor_impl.h"
#include "base/error.h"

#include <string.h>

static spmd_status check_access(const spmd_program *p, const spmd_tensor *t, size_t bytes,
                                const char *what)
{
    spmd_status ok = executor_check_runnable(p, what);
    if (ok != SPMD_OK) return ok;
    if (!t) return base_error(SPMD_ERR_INVALID, "%s: tensor is NULL", what);
    if (t->graph != p->c.g)
        return base_error(SPMD_ERR_INVALID, "%s: tensor is not part of this program", what);
    if (bytes != ir_nbytes(t)) {
        char s[96];
        return base_error(SPMD_ERR_SHAPE, "%s: '%s' %s %s holds %zu bytes, buffer has %zu", what,
                          t->name ? t->name : ir_op_name(t->op), spmd_dtype_name(t->dtype),
                          ir_shape_str(t, s, sizeof s), ir_nbytes(t), bytes);
    }
    if (p->c.partitioned && !p->c.part.local_of[t->id])
        return base_error(SPMD_ERR_INVALID,
                          "%s: %s '%s' is not kept after a run; mark it with "
                          "spmd_graph_mark_output before compiling",
                          what, ir_op_name(t->op), t->name ? t->name : "(unnamed)");
    return SPMD_OK;
}

static spmd_status check_copy(const spmd_program *p, int copy, const char *what)
{
    if (copy < 0 || copy >= p->copies)
        return base_error(SPMD_ERR_INVALID, "%s: copy %d, the program has %d (0 to %d)", what, copy,
                          p->copies, p->copies - 1);
    return SPMD_OK;
}

void exec_note_input_set(spmd_program *p, const spmd_tensor *t, int copy)
{
    bool *set = &p->input_set[(size_t)t->id * (size_t)p->copies];
    for (int c = 0; c < p->copies; c++)
        if (copy < 0 || c == copy) set[c] = true;
}

/* An accumulator holds each device's own part of a sum in progress: no
 * whole value to read or write. */
static spmd_status accumulator_refused(const spmd_tensor *t, const char *what)
{
    return base_error(SPMD_ERR_INVALID,
                      "%s: '%s' is a gradient accumulator, which holds each device's part of "
                      "the sum of a step's micro-batches; read the gradient norm or the "
                      "parameters instead", what, t->name);
}

/* What put() writes: a program input, or a parameter or state. */
typedef enum put_kind { PUT_INPUT, PUT_PERSISTENT } put_kind;

/* set_input and write: into copy `copy`'s devices (one_copy), or every
 * copy's. */
static spmd_status put(spmd_program *p, put_kind kind, bool one_copy, int copy,
                       const spmd_tensor *t, const void *src, size_t bytes)
{
    const char *what = kind == PUT_INPUT ? "set_input" : "write";
    spmd_status st = check_access(p, t, bytes, what);
    if (st == SPMD_OK && one_copy) st = check_copy(p, copy, what);
    if (st != SPMD_OK) return st;
    if (t->accumulator) return accumulator_refused(t, what);
    if (kind == PUT_INPUT ? t->op != IR_INPUT : !ir_is_persistent(t))
        return base_error(SPMD_ERR_INVALID, "%s: '%s' is a %s, not %s", what,
                          t->name ? t->name : "(unnamed)", ir_op_name(t->op),
                          kind == PUT_INPUT ? "an input" : "a param or state");
    exec_scatter(p, t, src, one_copy ? copy : -1);
    if (kind == PUT_INPUT) exec_note_input_set(p, t, one_copy ? copy : -1);
    return SPMD_OK;
}

spmd_status spmd_program_set_input(spmd_program *p, const spmd_tensor *t, const void *data,
                                   size_t bytes)
{
    return put(p, PUT_INPUT, false, 0, t, data, bytes);
}

spmd_status spmd_program_set_input_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                        const void *data, size_t bytes)
{
    return put(p, PUT_INPUT, true, copy, t, data, bytes);
}

spmd_status spmd_program_write(spmd_program *p, const spmd_tensor *t, const void *src,
                               size_t bytes)
{
    return put(p, PUT_PERSISTENT, false, 0, t, src, bytes);
}

spmd_status spmd_program_write_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                    const void *src, size_t bytes)
{
    return put(p, PUT_PERSISTENT, true, copy, t, src, bytes);
}

spmd_status spmd_program_read_copy(const spmd_program *p, int copy, const spmd_tensor *t,
                                   void *dst, size_t bytes)
{
    spmd_status st = check_access(p, t, bytes, "read");
    if (st == SPMD_OK) st = check_copy(p, copy, "read");
    if (st != SPMD_OK) return st;
    if (t->accumulator) return accumulator_refused(t, "read");
    if (!ir_op_is_leaf(t->op) && !t->is_output)
        return base_error(SPMD_ERR_INVALID,
                          "read: %s '%s' is not kept after a run; mark it with "
                          "spmd_graph_mark_output before compiling",
                          ir_op_name(t->op), t->name ? t->name : "(unnamed)");
    exec_init_pending(p);
    if (exec_spread_over_processes(p, t)) return exec_assemble_across(p, t, dst, copy);
    exec_assemble(p, t, dst, copy);
    return SPMD_OK;
}

spmd_status spmd_program_read(const spmd_program *p, const spmd_tensor *t, void *dst,
                              size_t bytes)
{
    return spmd_program_read_copy(p, 0, t, dst, bytes);
}

spmd_status spmd_program_input_rows(const spmd_program *p, const spmd_tensor *t, int64_t *begin,
                                    int64_t *end)
{
    spmd_status st = check_access(p, t, t ? ir_nbytes(t) : 0, "input_rows");
    if (st != SPMD_OK) return st;
    if (!begin || !end) return base_error(SPMD_ERR_INVALID, "input_rows: begin or end is NULL");
    if (t->rank == 0) {
        *begin = 0, *end = 1;
        return SPMD_OK;
    }
    int64_t lo = t->dims[0], hi = 0;
    for (int d = 0; d < p->n_local; d++) {
        block b = exec_block_of(p, t, p->dev[d].id);
        if (b.valid[0] == 0) continue; /* all padding */
        int64_t first = exec_block_global(&b, 0, 0), last = exec_block_global(&b, 0, b.valid[0] - 1);
        if (first < lo) lo = first;
        if (last + 1 > hi) hi = last + 1;
    }
    *begin = lo < hi ? lo : 0;
    *end = lo < hi ? hi : 0;
    return SPMD_OK;
}
