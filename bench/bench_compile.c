/*
 * Compile time of deep models: what `spmd explain --layers N` waits for.
 * Builds the default GPT of the tool (vocab 13, seq 40, dim 96, 4 heads,
 * batch 32) with N layers on a 4x2 (replica, fsdp) mesh, FSDP-wrapped,
 * with its backward pass and AdamW, then compiles it plan-only.  Prints
 * the median build and compile times over a few repeats (with the default
 * allocator, as the tool), the graph's node count, the most bytes the
 * compile held at once (one more run, through a counting allocator), and
 * the ratio of the deepest to the shallowest model's times (linear in
 * depth: the ratio of the depths).
 *
 * Repeats in one process reuse memory the first run faulted in, where a
 * fresh `spmd explain` pays for all of it; on a virtual machine that makes
 * faults dear, time the tool too.
 *
 *   bench_compile [--reps N] [--layers 100,1000]
 */
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

#include "bench_time.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- An allocator that tracks the bytes held (each block has a header) ---- */

typedef struct held {
    size_t now, peak;
} held;

enum { HEADER = 64 }; /* keeps the 64-byte alignment the hook promises */

static void *held_alloc(void *ctx, size_t bytes)
{
    held *h = ctx;
    unsigned char *p = aligned_alloc(HEADER, (HEADER + bytes + HEADER - 1) / HEADER * HEADER);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    h->now += bytes;
    if (h->now > h->peak) h->peak = h->now;
    return p + HEADER;
}

static void held_free(void *ctx, void *ptr)
{
    held *h = ctx;
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - HEADER;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    h->now -= bytes;
    free(p);
}

/* ---- One model --------------------------------------------------------------- */

static void die(const char *what)
{
    fprintf(stderr, "bench_compile: %s: %s\n", what, spmd_last_error());
    exit(1);
}

/* The training step of `spmd explain --layers N`, as tools/cli.c builds it. */
static spmd_graph *build(int layers, const spmd_mesh *mesh, const spmd_allocator *alloc)
{
    spmd_graph *g = spmd_graph_create(alloc);
    if (!g) die("graph");
    spmd_gpt_config cfg = {.vocab = 13, .seq = 40, .layers = layers, .heads = 4, .dim = 96};
    spmd_gpt_tensors t;
    if (spmd_gpt_build(g, &cfg, 32, &t) != SPMD_OK) die("gpt");
    spmd_tensor *inputs[2] = {t.input, t.targets};
    if (spmd_fsdp_wrap(g, mesh, "fsdp", inputs, 2, NULL) != SPMD_OK) die("fsdp");
    if (spmd_graph_mark_output(g, t.loss) != SPMD_OK) die("output");
    if (spmd_grad(g, t.loss) != SPMD_OK) die("grad");
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f, .beta1 = 0.9f,
                          .beta2 = 0.999f, .eps = 1e-8f, .clip_norm = 1.0f};
    if (spmd_optimizer_apply(g, &opt, NULL) != SPMD_OK) die("optimizer");
    return g;
}

typedef struct result {
    double build_s, compile_s;
    int nodes;
    size_t peak_bytes; /* held at once while compiling */
} result;

/* Build and compile once; times in *r, or the bytes held in *r when
 * `track` (the timed runs use the default allocator, as the tool does). */
static void once(int layers, const spmd_mesh *mesh, bool track, result *r)
{
    held h = {0, 0};
    spmd_allocator alloc = {held_alloc, held_free, &h};
    double t0 = now_s();
    spmd_graph *g = build(layers, mesh, track ? &alloc : NULL);
    double t1 = now_s();
    size_t before = h.now;
    h.peak = h.now;
    spmd_compile_options copt = {.plan_only = true};
    spmd_program *p = spmd_compile(g, &copt);
    if (!p) die("compile");
    double t2 = now_s();
    r->nodes = spmd_graph_tensor_count(g);
    if (track) r->peak_bytes = h.peak - before;
    r->build_s = t1 - t0;
    r->compile_s = t2 - t1;
    spmd_program_free(p);
    spmd_graph_free(g);
}

static result measure(int layers, const spmd_mesh *mesh, int reps)
{
    double *tb = calloc((size_t)reps, sizeof *tb), *tc = calloc((size_t)reps, sizeof *tc);
    result r = {0};
    for (int i = 0; i < reps; i++) {
        once(layers, mesh, false, &r);
        tb[i] = r.build_s;
        tc[i] = r.compile_s;
    }
    once(layers, mesh, true, &r);
    r.build_s = median(tb, reps);
    r.compile_s = median(tc, reps);
    free(tb);
    free(tc);
    return r;
}

int main(int argc, char **argv)
{
    int reps = 3, depth[8] = {100, 1000}, n_depth = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            n_depth = 0;
            for (char *s = strtok(argv[++i], ","); s && n_depth < 8; s = strtok(NULL, ","))
                depth[n_depth++] = atoi(s);
        } else {
            fprintf(stderr, "usage: bench_compile [--reps N] [--layers 100,1000]\n");
            return 2;
        }
    }
    if (reps < 1 || n_depth < 1) return 2;
    spmd_mesh *mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    if (!mesh) die("mesh");
    printf("GPT (dim 96, 4 heads, seq 40, batch 32) on a 4x2 mesh, FSDP, AdamW; plan only\n");
    printf("median of %d: %7s %9s %11s %11s %13s\n", reps, "layers", "nodes", "build ms",
           "compile ms", "compile MiB");
    result first = {0}, last = {0};
    for (int k = 0; k < n_depth; k++) {
        result r = measure(depth[k], mesh, reps);
        printf("%12s %7d %9d %11.1f %11.1f %13.1f\n", "", depth[k], r.nodes, r.build_s * 1e3,
               r.compile_s * 1e3, (double)r.peak_bytes / (1 << 20));
        if (k == 0) first = r;
        last = r;
    }
    if (n_depth > 1)
        printf("ratio %d/%d layers: build %.1f, compile %.1f, build + compile %.1f "
               "(linear: %.1f)\n",
               depth[n_depth - 1], depth[0], last.build_s / first.build_s,
               last.compile_s / first.compile_s,
               (last.build_s + last.compile_s) / (first.build_s + first.compile_s),
               (double)depth[n_depth - 1] / depth[0]);
    spmd_mesh_free(mesh);
    return 0;
}
