/*
 * The whole training step (forward, backward and the AdamW update, with
 * clipping) of three workloads, on one device and on meshes, next to the
 * bare sgemm rate of the same BLAS measured in the same run:
 *
 *   - the GPT-2 124M shape, batch 4, seq 64, one device;
 *   - an MLP of four 1024 x 1024 layers (vocabulary 13 in and out), batch
 *     64, on meshes 1, 2 'fsdp', 2 'data', 4x2 'replica,fsdp', 8 'data';
 *   - a small GPT (4 layers, dim 256, vocab 512, seq 128), batch 8, on
 *     meshes 1, 2 'data', 4x2 'replica,fsdp', 8 'data';
 *   - the same GPT with 8 experts (GShard, top-2, capacity factor 1.25)
 *     in blocks 1 and 3, on one device and on 2x4 'data,expert' with the
 *     experts split over 'expert' (spmd_gpt_shard_experts);
 *   - the same GPT at seq 2048, batch 1, on one device and on 4 'cp' with
 *     its sequence split (spmd_gpt_shard_context_parallel) and FSDP over
 *     the same axis;
 *   - the small GPT's batch 8 as 8 micro-batches of 1: on one device
 *     whole and accumulated over the 8, on 2 'data', and on 2 'pp' as 2
 *     pipeline stages (spmd_gpt_build_stages, GPipe);
 *
 * the replicated meshes by default (ZeRO: the optimizer's state and update
 * sharded, spmd_optimizer.zero) and with ZeRO off (rows "zero off": every
 * replica updates whole), and the GPTs on one device (and the small
 * one on 4x2) also with bf16 matmuls (spmd_graph_set_matmul_precision:
 * mixed precision, --precision bf16).
 *
 * GFLOP/s counts 6 x multiplying parameters x tokens per step (plus
 * attention's 12 x layers x dim x seq per token; with experts, the
 * experts' products over the rows they take, capacity x experts per
 * sequence, and the dispatch and combine products); ratios compare with the
 * bare sgemm rate on all threads and with the workload's one-device step.
 * Medians of --reps steps after one unmeasured.
 *
 *   bench_step [--reps N] [--threads N] [--quick] [--only mlp|gpt|124m|moe|long|pp]
 *              [--mesh SHAPE] [--fp32|--bf16] [--overlap-compare]
 *
 * (--quick: the MLP and the small GPT only; --only one workload (--124m: --only 124m); --mesh
 * only its cases on that mesh, "1" for one device; --fp32, --bf16: only
 * the rows of that precision, for a profile; --overlap-compare: each
 * mesh row three times with collectives in flight and three times
 * without, in turn, the medians side by side.)
 */
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

#include "bench_sgemm.h"
#include "bench_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct workload {
    const char *name;
    bool gpt;
    spmd_gpt_config cfg; /* gpt; for the MLP: vocab, layers, dim = width */
    int batch;
} workload;

typedef struct mesh_case {
    const char *shape, *axes, *fsdp; /* fsdp: the axis parameters are sharded over, or NULL */
    bool zero_off;                   /* every replica updates whole (ZeRO off) */
    bool bf16;                       /* matmuls on bf16 copies (mixed precision) */
    const char *expert;              /* the experts' axis (expert parallelism), or NULL */
    const char *context;             /* the sequence's axis (context parallelism), or NULL */
    const char *stage;               /* the pipeline's stage axis, or NULL */
    int micro;                       /* > 1: micro-batches, of the pipeline or else accumulated */
} mesh_case;

static double flops_per_step(const workload *w, int64_t params)
{
    double tokens = (double)w->batch * (w->gpt ? w->cfg.seq : 1);
    double mults = (double)params, attn = 0;
    if (w->gpt) {
        mults -= (double)w->cfg.seq * w->cfg.dim; /* the position table is only added */
        attn = 12.0 * w->cfg.layers * w->cfg.dim * w->cfg.seq;
    }
    double experts = 0;
    if (w->gpt && w->cfg.experts > 0) {
        /* A token multiplies its experts' weights only as one of the
         * capacity x E rows of its sequence the experts take, and the
         * dispatch and combine multiply [T, E x capacity] by [T, C]. */
        const spmd_gpt_config *c = &w->cfg;
        double moe_blocks = c->layers / 2, e = c->experts, dim = c->dim;
        double cap = (int)((double)c->top_k * c->seq * c->capacity_factor / e);
        mults -= moe_blocks * e * (8.0 * dim * dim + 5.0 * dim);
        double rows = cap * e * w->batch;
        experts = moe_blocks * (6.0 * rows * (8.0 * dim * dim) +
                                12.0 * w->batch * c->seq * e * cap * dim);
    }
    return (6.0 * mults + attn) * tokens + experts;
}

/* Every collective a blocking step (spmd_compile_options.overlap unset). */
static bool no_overlap;

/* Build, mark, compile and time `reps` steps; ms per step (median) or < 0. */
static double time_step(const workload *w, const mesh_case *mc, int threads, int reps, int64_t *params,
                        size_t *arena, size_t *held, double *cpu_ms)
{
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mesh *mesh = mc->shape ? spmd_mesh_parse(mc->shape, mc->axes) : NULL;
    spmd_tensor *input, *targets, *loss;
    spmd_status st = spmd_graph_set_matmul_precision(g, mc->bf16 ? SPMD_BF16 : SPMD_F32);
    if (st != SPMD_OK) {
        input = targets = loss = NULL;
    } else if (w->gpt && mc->stage) {
        /* One stage per member of the stage axis, the batch's rows as
         * micro-batches ([M, b, T]), whole on every stage. */
        int axis = spmd_mesh_axis_index(mesh, mc->stage);
        spmd_gpt_tensors t = {0};
        st = spmd_mesh_set_stage_axis(mesh, axis);
        if (st == SPMD_OK)
            st = spmd_gpt_build_stages(g, &w->cfg, w->batch / mc->micro, spmd_mesh_axis_size(mesh, axis),
                                       mc->micro, &t);
        for (int j = 0; j < 2 && st == SPMD_OK; j++)
            st = spmd_mark_sharding(g, j ? t.targets : t.input, mesh, "None, None, None");
        input = t.input, targets = t.targets, loss = t.loss;
    } else if (w->gpt) {
        spmd_gpt_tensors t;
        st = spmd_gpt_build(g, &w->cfg, mc->micro > 1 ? w->batch / mc->micro : w->batch, &t);
        input = t.input, targets = t.targets, loss = t.loss;
    } else {
        spmd_mlp_config cfg = {.in_dim = w->cfg.vocab, .hidden = w->cfg.dim, .layers = w->cfg.layers,
                               .out_dim = w->cfg.vocab};
        spmd_mlp_tensors t;
        st = spmd_mlp_build(g, &cfg, NULL, w->batch, &t);
        if (st == SPMD_OK) st = spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &t);
        input = t.input, targets = t.targets, loss = t.loss;
    }
    spmd_tensor *inputs[2] = {input, targets};
    if (st == SPMD_OK && mesh && mc->expert)
        st = spmd_gpt_shard_experts(g, &w->cfg, mesh, mc->expert, NULL, NULL);
    if (st == SPMD_OK && mesh && mc->context) {
        spmd_gpt_parallel how = {NULL, mc->fsdp, NULL, false, mc->context};
        st = spmd_gpt_shard_context_parallel(g, &w->cfg, mesh, &how);
    }
    if (st == SPMD_OK && mesh && !mc->stage)
        st = mc->fsdp ? spmd_fsdp_wrap(g, mesh, mc->fsdp, inputs, 2, NULL)
                      : spmd_shard_batch(g, mesh, inputs, 2, NULL);
    *params = spmd_graph_param_count(g);
    spmd_trainer_options opts = {
        .optimizer = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f, .clip_norm = 1.0f,
                      .zero = mc->zero_off ? SPMD_ZERO_OFF : SPMD_ZERO_DEFAULT,
                      .accumulate_steps = mc->stage ? 0 : mc->micro},
        .compile = {.threads = threads, .seed = 1, .overlap = !no_overlap && !mc->stage}}; /* stages: not built */
    spmd_trainer *tr = st == SPMD_OK ? spmd_trainer_create(g, loss, &opts) : NULL;
    double ms = -1;
    if (tr) {
        spmd_program *p = spmd_trainer_program(tr);
        *arena = spmd_program_arena_bytes(p);
        *held = spmd_program_held_bytes(p);
        int seq = w->gpt ? w->cfg.seq : 1;
        size_t n = (size_t)w->batch * (size_t)seq;
        int32_t *ids = malloc(n * sizeof *ids), *tg = malloc(n * sizeof *tg);
        float *onehot = w->gpt ? NULL : calloc(n * (size_t)w->cfg.vocab, sizeof *onehot);
        double *t = malloc(sizeof(double) * (size_t)reps), *c = malloc(sizeof(double) * (size_t)reps);
        spmd_data_sequences(1, 0, w->batch, seq, w->cfg.vocab, ids, tg);
        if (onehot)
            for (size_t i = 0; i < n; i++) onehot[i * (size_t)w->cfg.vocab + (size_t)ids[i]] = 1.0f;
        /* Accumulated: the step's micro-batches one after another, each
         * its rows of the batch. */
        int k = mc->micro > 1 && !mc->stage ? mc->micro : 1;
        size_t part = n / (size_t)k;
        st = k > 1 ? SPMD_OK
             : onehot ? spmd_program_set_input(p, input, onehot, n * (size_t)w->cfg.vocab * sizeof *onehot)
                    : spmd_program_set_input(p, input, ids, n * sizeof *ids);
        if (st == SPMD_OK && k == 1) st = spmd_program_set_input(p, targets, tg, n * sizeof *tg);
        for (int r = -1; r < reps && st == SPMD_OK; r++) {
            double t0 = now_s(), c0 = cpu_s();
            for (int m = 0; m < k && st == SPMD_OK; m++) {
                if (k > 1) st = spmd_program_set_input(p, input, ids + (size_t)m * part, part * sizeof *ids);
                if (k > 1 && st == SPMD_OK)
                    st = spmd_program_set_input(p, targets, tg + (size_t)m * part, part * sizeof *tg);
                if (st == SPMD_OK && m < k - 1) st = spmd_trainer_accumulate(tr, NULL);
            }
            if (st == SPMD_OK) st = spmd_trainer_step(tr, 1e-3f, NULL, NULL);
            if (r >= 0) t[r] = now_s() - t0, c[r] = cpu_s() - c0;
        }
        if (st == SPMD_OK) ms = median(t, reps) * 1e3, *cpu_ms = median(c, reps) * 1e3;
        free(ids), free(tg), free(onehot), free(t), free(c);
    }
    if (ms < 0) fprintf(stderr, "bench_step: %s %s: %s\n", w->name, mc->shape ? mc->shape : "1", spmd_last_error());
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return ms;
}

int main(int argc, char **argv)
{
    int reps = 5, threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bool quick = false, only_bf16 = false, only_fp32 = false, compare = false;
    const char *only = NULL, *only_mesh = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--124m")) only = "124m";
        else if (!strcmp(argv[i], "--mesh") && i + 1 < argc) only_mesh = argv[++i];
        else if (!strcmp(argv[i], "--bf16")) only_bf16 = true;
        else if (!strcmp(argv[i], "--fp32")) only_fp32 = true;
        else if (!strcmp(argv[i], "--overlap-compare")) compare = true;
        else {
            fprintf(stderr, "usage: bench_step [--reps N] [--threads N] [--quick] "
                            "[--only mlp|gpt|124m|moe|long|pp] [--mesh SHAPE] [--fp32|--bf16] "
                            "[--overlap-compare]\n");
            return 2;
        }
    }
    static const char *const keys[] = {"124m", "mlp", "gpt", "moe", "long", "pp"};
    enum { n_loads = sizeof keys / sizeof keys[0] };
    int only_load = -1;
    for (int l = 0; only && l < n_loads; l++)
        if (!strcmp(only, keys[l])) only_load = l;
    if (only && only_load < 0) {
        fprintf(stderr, "bench_step: --only %s: mlp, gpt, 124m, moe, long or pp\n", only);
        return 2;
    }
    if (reps < 1) reps = 1;
    const char *blas = spmd_blas_describe();
    if (!blas) {
        fprintf(stderr, "bench_step: %s\n", spmd_last_error());
        return 1;
    }
    static const workload loads[] = {
        {"GPT-2 124M, batch 4, seq 64", true,
         {.vocab = 50257, .seq = 64, .context = 1024, .layers = 12, .heads = 12, .dim = 768}, 4},
        {"MLP 4 x 1024^2, batch 64", false, {.vocab = 13, .layers = 5, .dim = 1024}, 64},
        {"GPT 4 x 256, vocab 512, seq 128, batch 8", true,
         {.vocab = 512, .seq = 128, .layers = 4, .heads = 4, .dim = 256}, 8},
        {"GPT 4 x 256, 8 experts top-2, batch 8", true,
         {.vocab = 512, .seq = 128, .layers = 4, .heads = 4, .dim = 256, .experts = 8, .top_k = 2,
          .capacity_factor = 1.25f},
         8},
        {"GPT 4 x 256, vocab 512, seq 2048, batch 1", true,
         {.vocab = 512, .seq = 2048, .layers = 4, .heads = 4, .dim = 256}, 1},
        {"GPT 4 x 256, batch 8 as 8 micro-batches", true,
         {.vocab = 512, .seq = 128, .layers = 4, .heads = 4, .dim = 256}, 8},
    };
    /* {shape, axes, fsdp, zero off, bf16, expert axis, context axis, stage axis, micro-batches} */
#define CASE(shape, axes, fsdp, zero_off, bf16) {shape, axes, fsdp, zero_off, bf16, NULL, NULL, NULL, 1}
    static const mesh_case one[] = {CASE(NULL, NULL, NULL, false, false), CASE(NULL, NULL, NULL, false, true)};
    static const mesh_case mlp_meshes[] = {
        CASE(NULL, NULL, NULL, false, false),           CASE("2", "fsdp", "fsdp", false, false),
        CASE("2", "data", NULL, false, false),          CASE("2", "data", NULL, true, false),
        CASE("4x2", "replica,fsdp", "fsdp", false, false), CASE("4x2", "replica,fsdp", "fsdp", true, false),
        CASE("8", "data", NULL, false, false),          CASE("8", "data", NULL, true, false)};
    static const mesh_case gpt_meshes[] = {
        CASE(NULL, NULL, NULL, false, false),           CASE(NULL, NULL, NULL, false, true),
        CASE("2", "data", NULL, false, false),          CASE("2", "data", NULL, true, false),
        CASE("4x2", "replica,fsdp", "fsdp", false, false), CASE("4x2", "replica,fsdp", "fsdp", false, true),
        CASE("4x2", "replica,fsdp", "fsdp", true, false), CASE("8", "data", NULL, false, false),
        CASE("8", "data", NULL, true, false)};
#undef CASE
    static const mesh_case moe_meshes[] = {{NULL, NULL, NULL, false, false, NULL, NULL, NULL, 1},
                                           {"2x4", "data,expert", NULL, false, false, "expert", NULL, NULL, 1}};
    static const mesh_case long_meshes[] = {{NULL, NULL, NULL, false, false, NULL, NULL, NULL, 1},
                                            {"4", "cp", "cp", false, false, NULL, "cp", NULL, 1}};
    static const mesh_case pp_meshes[] = {{NULL, NULL, NULL, false, false, NULL, NULL, NULL, 1},
                                          {NULL, NULL, NULL, false, false, NULL, NULL, NULL, 8},
                                          {"2", "data", NULL, false, false, NULL, NULL, NULL, 1},
                                          {"2", "pp", NULL, false, false, NULL, NULL, "pp", 8}};
    const mesh_case *meshes[] = {one, mlp_meshes, gpt_meshes, moe_meshes, long_meshes, pp_meshes};
    const int n_meshes[] = {2, 8, 9, 2, 2, 4};
    printf("bench_step: the whole AdamW training step, %d threads, %s, median of %d steps\n", threads,
           blas, reps);
    printf("bf16 GEMM: %s\n", spmd_blas_describe_bf16());
    printf("%-42s %-26s %10s %10s %8s %8s %8s %10s %9s%s\n", "workload", "mesh", "ms/step", "GFLOP/s",
           "/sgemm", "/mesh 1", "cpu ms", "arena MiB", "held MiB", compare ? "  no overlap" : "");
    for (int l = quick ? 1 : 0; l < (quick ? 3 : n_loads); l++) {
        const workload *w = &loads[l];
        if (only && l != only_load) continue;
        /* The bare rate: the better of a product of the workload's own
         * size (its MLP's first layer) and a 1024-cube. */
        int64_t rows = (int64_t)w->batch * (w->gpt ? w->cfg.seq : 1);
        double peak = sgemm_gflops(rows < 256 ? 256 : rows, 4 * w->cfg.dim, w->cfg.dim, threads, 9);
        double cube = sgemm_gflops(1024, 1024, 1024, threads, 5);
        if (cube > peak) peak = cube;
        double base = 0;
        bool named = false; /* the workload's name on its first row shown */
        for (int k = 0; k < n_meshes[l]; k++) {
            const mesh_case *mc = &meshes[l][k];
            if ((only_bf16 && !mc->bf16) || (only_fp32 && mc->bf16)) continue;
            if (only_mesh && strcmp(only_mesh, mc->shape ? mc->shape : "1")) continue;
            int64_t params = 0;
            size_t arena = 0, held = 0;
            double cpu_ms = 0;
            int n_reps = l == 0 ? (reps < 3 ? reps : 3) : reps;
            double ms, off = 0;
            if (compare && mc->shape) {
                /* In turn, so that the machine's load falls on both alike. */
                double on_ms[3], off_ms[3], off_cpu = 0;
                size_t off_arena = 0, off_held = 0;
                for (int r = 0; r < 3; r++) {
                    no_overlap = false;
                    on_ms[r] = time_step(w, mc, threads, n_reps, &params, &arena, &held, &cpu_ms);
                    no_overlap = true;
                    off_ms[r] = time_step(w, mc, threads, n_reps, &params, &off_arena, &off_held, &off_cpu);
                    if (on_ms[r] < 0 || off_ms[r] < 0) return 1;
                }
                no_overlap = false;
                ms = median(on_ms, 3), off = median(off_ms, 3);
            } else {
                ms = time_step(w, mc, threads, n_reps, &params, &arena, &held, &cpu_ms);
            }
            if (ms < 0) return 1;
            if (k == 0) base = ms;
            double rate = flops_per_step(w, params) / (ms / 1e3) / 1e9;
            char mesh[48];
            char micro[32] = "";
            if (mc->micro > 1)
                snprintf(micro, sizeof micro, mc->stage ? " x %d micro-batches" : " accumulate %d", mc->micro);
            snprintf(mesh, sizeof mesh, "%s %s%s%s%s", mc->shape ? mc->shape : "1", mc->axes ? mc->axes : "",
                     mc->zero_off ? " zero off" : "", mc->bf16 ? " bf16" : "", micro);
            char ratio[16] = "-";
            if (base > 0) snprintf(ratio, sizeof ratio, "%.2f", ms / base);
            printf("%-42s %-26s %10.1f %10.1f %8.2f %8s %8.1f %10.1f %9.1f", named ? "" : w->name, mesh,
                   ms, rate, rate / peak, ratio, cpu_ms, (double)arena / (1 << 20),
                   (double)held / (1 << 20));
            if (off > 0) printf("  %10.1f", off);
            printf("\n");
            named = true;
            fflush(stdout);
        }
        printf("%-42s %-26s %10s %10.1f\n", "", "(bare sgemm)", "", peak);
    }
    return 0;
}
