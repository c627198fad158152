/* Smoke test: errors, status names, and that a BLAS library loads and
 * multiplies correctly (row-major, with and without transposes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/arena.h"
#include "base/error.h"
#include "runtime/blas.h"
#include "spmd/spmd.h"

static void test_status_names(void **state)
{
    (void)state;
    assert_string_equal(spmd_status_name(SPMD_OK), "ok");
    assert_string_equal(spmd_status_name(SPMD_ERR_BACKEND), "backend error");
    assert_string_equal(spmd_status_name((spmd_status)999), "unknown status");
}

static void test_last_error(void **state)
{
    (void)state;
    spmd_clear_error();
    assert_string_equal(spmd_last_error(), "");
    assert_int_equal(base_error_status(), SPMD_OK);
    assert_int_equal(base_error(SPMD_ERR_SHAPE, "bad dim %d", 7), SPMD_ERR_SHAPE);
    assert_string_equal(spmd_last_error(), "bad dim 7");
    assert_int_equal(base_error_status(), SPMD_ERR_SHAPE);
    spmd_clear_error();
    assert_string_equal(spmd_last_error(), "");
    assert_int_equal(base_error_status(), SPMD_OK);
}

static void *refuse(void *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return NULL;
}

static void ignore_free(void *ctx, void *ptr)
{
    (void)ctx;
    (void)ptr;
}

/* An allocation failure is recorded as SPMD_ERR_NOMEM: callers learn it
 * from the status, not from the wording of the message. */
static void test_out_of_memory_status(void **state)
{
    (void)state;
    const spmd_allocator none = {refuse, ignore_free, NULL};
    spmd_clear_error();
    assert_null(base_alloc(&none, 64, "a test buffer"));
    assert_int_equal(base_error_status(), SPMD_ERR_NOMEM);
    assert_non_null(strstr(spmd_last_error(), "a test buffer"));
}

static void test_blas_describe(void **state)
{
    (void)state;
    const char *name = spmd_blas_describe();
    if (!name) {
        fail_msg("no BLAS: %s", spmd_last_error());
        return;
    }
    print_message("BLAS: %s\n", name);
    assert_true(strstr(name, "OpenBLAS") != NULL || strstr(name, "BLIS") != NULL);
    assert_string_equal(blas_name(), name);
    /* Later calls give the first result. */
    assert_int_equal(blas_init(BLAS_BLIS, "Prescott"), SPMD_OK);
    assert_string_equal(spmd_blas_describe(), name);
}

/* C[m,n] = alpha op(A) op(B) + beta C, the obvious way. */
static void naive_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                        int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float av = ta ? a[p * lda + i] : a[i * lda + p];
                float bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += (double)av * bv;
            }
            c[i * ldc + j] = (float)(alpha * s + beta * c[i * ldc + j]);
        }
}

static void test_blas_sgemm(void **state)
{
    (void)state;
    enum { M = 3, K = 4, N = 5 };
    assert_int_equal(blas_init(BLAS_AUTO, NULL), SPMD_OK);
    float a[M * K], at[K * M], b[K * N], bt[N * K];
    for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++)
            a[i * K + p] = at[p * M + i] = (float)(i * K + p + 1) * 0.25f - 1.0f;
    for (int p = 0; p < K; p++)
        for (int j = 0; j < N; j++)
            b[p * N + j] = bt[j * K + p] = (float)((p * N + j) % 7) - 2.5f;

    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float got[M * N], want[M * N];
            for (int i = 0; i < M * N; i++)
                got[i] = want[i] = (float)i * 0.5f;
            const float *pa = ta ? at : a, *pb = tb ? bt : b;
            int lda = ta ? M : K, ldb = tb ? K : N;
            assert_int_equal(blas_sgemm(ta, tb, M, N, K, 1.5f, pa, lda, pb, ldb, 0.5f, got, N),
                             SPMD_OK);
            naive_sgemm(ta, tb, M, N, K, 1.5f, pa, lda, pb, ldb, 0.5f, want, N);
            for (int i = 0; i < M * N; i++)
                assert_float_equal(got[i], want[i], 1e-4f);
        }

    /* k = 0: C = beta C. */
    float c[2] = {2.0f, -4.0f};
    assert_int_equal(blas_sgemm(false, false, 1, 2, 0, 1.0f, a, 1, b, 2, 0.5f, c, 2), SPMD_OK);
    assert_float_equal(c[0], 1.0f, 0.0f);
    assert_float_equal(c[1], -2.0f, 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_last_error),
        cmocka_unit_test(test_out_of_memory_status),
        cmocka_unit_test(test_blas_describe),
        cmocka_unit_test(test_blas_sgemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
