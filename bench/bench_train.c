/*
 * Forward + backward speed of the GPT-2 124M shape on one device, next to
 * the bare sgemm rate of the same BLAS in the same run, on 1 and 2
 * threads.  Achieved GFLOP/s counts 6 x parameters x tokens per step.
 *
 *   bench_train [--layers N] [--reps N] [--seqs 64,256] [--batch N]
 */
#include "runtime/blas.h"
#include "runtime/pool.h"
#include "spmd/models.h"
#include "spmd/spmd.h"

#include "bench_sgemm.h"
#include "bench_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Training step ---------------------------------------------------------- */

static int bench_gpt(const spmd_gpt_config *cfg, int batch, int threads, int reps, double *ms,
                     double *gflops, size_t *peak)
{
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    if (spmd_gpt_build(g, cfg, batch, &t) != SPMD_OK || spmd_graph_mark_output(g, t.loss) ||
        spmd_grad(g, t.loss) != SPMD_OK) {
        fprintf(stderr, "bench_train: %s\n", spmd_last_error());
        spmd_graph_free(g);
        return 1;
    }
    /* Keep every gradient, as a training step does before its update. */
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        spmd_tensor *p = spmd_graph_tensor(g, i);
        if (spmd_tensor_is_param(p)) spmd_graph_mark_output(g, spmd_tensor_grad(p));
    }
    spmd_compile_options o = {.threads = threads, .seed = 1};
    spmd_program *p = spmd_compile(g, &o);
    if (!p) {
        fprintf(stderr, "bench_train: %s\n", spmd_last_error());
        spmd_graph_free(g);
        return 1;
    }
    size_t n = (size_t)batch * (size_t)cfg->seq;
    int32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919) % (size_t)cfg->vocab);
    spmd_program_set_input(p, t.input, tok, n * sizeof *tok);
    spmd_program_set_input(p, t.targets, tok, n * sizeof *tok);
    double *times = malloc(sizeof(double) * (size_t)reps);
    int rc = 0;
    for (int r = -1; r < reps && !rc; r++) {
        double t0 = now_s();
        if (spmd_program_run(p) != SPMD_OK) {
            fprintf(stderr, "bench_train: %s\n", spmd_last_error());
            rc = 1;
        }
        if (r >= 0) times[r] = now_s() - t0;
    }
    if (!rc) {
        double s = median(times, reps);
        *ms = s * 1e3;
        *gflops = 6.0 * (double)spmd_gpt_param_count(cfg) * (double)n / s / 1e9;
        *peak = spmd_program_peak_bytes(p);
    }
    free(times), free(tok);
    spmd_program_free(p);
    spmd_graph_free(g);
    return rc;
}

int main(int argc, char **argv)
{
    spmd_gpt_config cfg = {.vocab = 50257, .seq = 64, .context = 1024, .layers = 12, .heads = 12, .dim = 768};
    int reps = 3, batch = 4;
    int seqs[4] = {64, 256}, n_seqs = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) cfg.layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seqs")) {
            n_seqs = 0;
            for (char *s = strtok(argv[i + 1], ","); s && n_seqs < 4; s = strtok(NULL, ","))
                seqs[n_seqs++] = atoi(s);
        }
    }
    if (reps < 1) reps = 1;
    const char *blas = spmd_blas_describe();
    if (!blas) {
        fprintf(stderr, "bench_train: %s\n", spmd_last_error());
        return 1;
    }
    printf("BLAS: %s\n", blas);
    printf("model: GPT-2 shape, %d layers, dim %d, vocab %d, %.1fM parameters, batch %d\n",
           cfg.layers, cfg.dim, cfg.vocab, (double)spmd_gpt_param_count(&cfg) / 1e6, batch);
    printf("%-8s %-8s %12s %12s %14s %12s %10s\n", "seq", "threads", "ms/step", "GFLOP/s",
           "sgemm GFLOP/s", "ratio", "peak MiB");
    for (int s = 0; s < n_seqs; s++) {
        cfg.seq = seqs[s];
        for (int threads = 1; threads <= 2; threads++) {
            /* The bare sgemm: the MLP's c_fc shape for this many tokens. */
            double peak_rate = sgemm_gflops((int64_t)batch * cfg.seq, 4 * cfg.dim, cfg.dim, threads, 9);
            double ms = 0, rate = 0;
            size_t peak = 0;
            if (bench_gpt(&cfg, batch, threads, reps, &ms, &rate, &peak)) return 1;
            printf("%-8d %-8d %12.1f %12.1f %14.1f %12.2f %10.1f\n", cfg.seq, threads, ms, rate,
                   peak_rate, rate / peak_rate, (double)peak / 1048576.0);
            fflush(stdout);
        }
    }
    return 0;
}
