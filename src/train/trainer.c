/*
 * The training step object: backward pass, optimizer and compile done
 * once, then one call per step (see spmd/train.h).
 */
#include "spmd/train.h"
#include "base/arena.h"
#include "base/error.h"
#include "ir/ir.h"

struct spmd_trainer {
    spmd_allocator alloc;
    spmd_program *program;
    spmd_tensor *loss;
    spmd_optimizer_tensors opt;
    double micro_loss; /* sum of the losses of the step's micro-batches so far */
    int micros;        /* micro-batches accumulated in the step so far */
};

spmd_trainer *spmd_trainer_create(spmd_graph *g, spmd_tensor *loss,
                                  const spmd_trainer_options *opts)
{
    /* A NULL loss from a failed builder: report that failure. */
    if (!loss && ir_error_raise(g) != SPMD_OK) return NULL;
    if (!g || !loss || !opts) {
        base_error(SPMD_ERR_INVALID, "trainer: graph, loss or options is NULL");
        return NULL;
    }
    spmd_trainer *t = base_calloc(&g->alloc, sizeof *t, "trainer");
    if (!t) return NULL;
    t->alloc = g->alloc;
    t->loss = loss;
    spmd_status st = spmd_graph_mark_output(g, loss);
    if (st == SPMD_OK)
        st = opts->n_checkpoints > 0
                 ? spmd_grad_checkpointed(g, loss, opts->checkpoints, opts->n_checkpoints)
                 : spmd_grad(g, loss);
    if (st == SPMD_OK) st = spmd_optimizer_apply(g, &opts->optimizer, &t->opt);
    if (st == SPMD_OK) t->program = spmd_compile(g, &opts->compile);
    if (!t->program) {
        base_free(&t->alloc, t);
        return NULL;
    }
    return t;
}

void spmd_trainer_free(spmd_trainer *t)
{
    if (!t) return;
    spmd_program_free(t->program);
    spmd_allocator a = t->alloc;
    base_free(&a, t);
}

spmd_program *spmd_trainer_program(const spmd_trainer *t) { return t ? t->program : NULL; }

spmd_status spmd_trainer_accumulate(spmd_trainer *t, float *loss)
{
    if (!t) return base_error(SPMD_ERR_INVALID, "trainer: NULL");
    float l = 0.0f;
    spmd_status st = spmd_program_accumulate(t->program);
    if (st == SPMD_OK) st = spmd_program_read(t->program, t->loss, &l, sizeof l);
    if (st != SPMD_OK) return st;
    t->micro_loss += l;
    t->micros++;
    if (loss) *loss = l;
    return SPMD_OK;
}

spmd_status spmd_trainer_step(spmd_trainer *t, float lr, float *loss, float *grad_norm)
{
    if (!t) return base_error(SPMD_ERR_INVALID, "trainer: NULL");
    float l = 0.0f;
    spmd_status st = spmd_program_set_input(t->program, t->opt.lr, &lr, sizeof lr);
    if (st == SPMD_OK) st = spmd_program_run(t->program);
    if (st == SPMD_OK) st = spmd_program_read(t->program, t->loss, &l, sizeof l);
    if (st == SPMD_OK && grad_norm)
        st = spmd_program_read(t->program, t->opt.grad_norm, grad_norm, sizeof *grad_norm);
    if (st != SPMD_OK) return st;
    /* The mean of equal micro-batches' means: the whole batch's mean. */
    if (loss) *loss = t->micros ? (float)((t->micro_loss + l) / (t->micros + 1)) : l;
    t->micro_loss = 0.0;
    t->micros = 0;
    return SPMD_OK;
}
