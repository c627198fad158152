/* Setting up op and gradient test cases (see support_case.h). */
#include "support_case.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>

#include <cmocka.h>

void test_fill_values(test_rng *r, float *v, int64_t n, test_gen kind)
{
    static const float range[][2] = {[GEN_ANY] = {-1.0f, 1.0f},
                                     [GEN_WIDE] = {-4.0f, 4.0f},
                                     [GEN_POS] = {0.5f, 2.0f},
                                     [GEN_NAN] = {-1.0f, 1.0f}};
    switch (kind) {
    case GEN_ANY:
    case GEN_WIDE:
    case GEN_POS:
    case GEN_NAN:
        for (int64_t i = 0; i < n; i++) {
            v[i] = test_rng_float(r, range[kind][0], range[kind][1]);
            if (kind == GEN_NAN && test_rng_next(r) % 16 == 0) v[i] = NAN;
        }
        break;
    case GEN_AWAY0:
        for (int64_t i = 0; i < n; i++) {
            float m = test_rng_float(r, 0.2f, 1.0f);
            v[i] = test_rng_next(r) & 1 ? m : -m;
        }
        break;
    case GEN_DISTINCT:
        for (int64_t i = 0; i < n; i++) v[i] = 0.1f * (float)(i - n / 2);
        for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = (int64_t)(test_rng_next(r) % (uint64_t)(i + 1));
            float t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
        break;
    }
}

void test_fill_ids(test_rng *r, int32_t *v, int64_t n, int32_t limit)
{
    for (int64_t i = 0; i < n; i++) v[i] = (int32_t)(test_rng_next(r) % (uint64_t)limit);
}

spmd_graph *test_case_start(char *label, size_t size, uint64_t seed, test_rng *r,
                            const char *fmt, va_list ap)
{
    vsnprintf(label, size, fmt, ap);
    *r = test_rng_for(seed, label);
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    return g;
}

size_t test_tensor_bytes(const spmd_tensor *t) { return (size_t)spmd_tensor_numel(t) * 4; }
