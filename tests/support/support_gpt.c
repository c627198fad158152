#include "support_gpt.h"

#include "spmd/data.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

void support_gpt_step(spmd_trainer *tr, const spmd_gpt_tensors *t, const spmd_gpt_config *cfg,
                      int batch, int step, float *loss)
{
    size_t n = (size_t)batch * (size_t)cfg->seq;
    int32_t *ids = malloc(n * sizeof *ids), *tg = malloc(n * sizeof *tg);
    assert_non_null(ids);
    assert_non_null(tg);
    spmd_program *p = spmd_trainer_program(tr);
    assert_int_equal(spmd_data_sequences(2, step * batch, batch, cfg->seq, cfg->vocab, ids, tg), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, t->input, ids, n * sizeof *ids), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, t->targets, tg, n * sizeof *tg), SPMD_OK);
    assert_int_equal(spmd_trainer_step(tr, 3e-3f, loss, NULL), SPMD_OK);
    free(ids), free(tg);
}

float *support_read_tensor(spmd_graph *g, spmd_program *p, const char *name, size_t *bytes)
{
    spmd_tensor *w = spmd_graph_find(g, name);
    assert_non_null(w);
    *bytes = (size_t)spmd_tensor_numel(w) * sizeof(float);
    float *v = malloc(*bytes);
    assert_non_null(v);
    assert_int_equal(spmd_program_read(p, w, v, *bytes), SPMD_OK);
    return v;
}
