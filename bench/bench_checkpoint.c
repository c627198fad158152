/*
 * Checkpoint save and load of the GPT-2 124M shape with AdamW state on a
 * 4x2 (replica, fsdp) mesh, next to the disk's write bandwidth measured
 * with dd (1 MiB blocks, fsync at the end) for the same number of bytes in
 * the same run.  Medians of --reps saves and loads; the load reads files
 * the save just wrote, so mostly from the page cache.  The checkpoint
 * (1.5 GB at the full shape) goes to a new directory under --dir, else
 * $TMPDIR, else /tmp, removed at the end, so nothing is left behind.
 * --layers, --dim (heads of 64) and --vocab shrink the shape.
 *
 *   bench_checkpoint [--dir PARENT] [--reps N] [--layers N] [--dim N] [--vocab N]
 */
#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

#include "train/checkpoint_fs.h"

#include "bench_time.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Bytes of the files in DIR/step-00000001. */
static double checkpoint_bytes(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/step-00000001", dir);
    DIR *d = opendir(path);
    double total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char file[1400];
        struct stat st;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        if (stat(file, &st) == 0 && S_ISREG(st.st_mode)) total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* dd's write rate for `bytes` into DIR, in MB/s (10^6), or -1. */
static double dd_rate(const char *dir, double bytes)
{
    char cmd[2300];
    snprintf(cmd, sizeof cmd,
             "dd if=/dev/zero of=%s/dd.bin bs=1M count=%.0f conv=fsync 2>&1 | tail -n 1; rm -f %s/dd.bin",
             dir, bytes / 1048576.0 + 1, dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512] = "";
    if (!fgets(line, sizeof line, p)) line[0] = '\0';
    pclose(p);
    /* "N bytes (...) copied, S s, R MB/s": bytes over seconds. */
    double n = 0, s = 0;
    const char *c = strstr(line, "copied, ");
    if (sscanf(line, "%lf", &n) != 1 || !c || sscanf(c + 8, "%lf", &s) != 1 || s <= 0) return -1;
    return n / s / 1e6;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_checkpoint [--dir PARENT] [--reps N] [--layers N] [--dim N] "
                    "[--vocab N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR");
    const char *parent = tmp && *tmp ? tmp : "/tmp";
    int reps = 3, layers = 12, dim = 768, vocab = 50257;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--dir")) parent = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab")) vocab = atoi(argv[i + 1]);
        else return usage();
    }
    if (reps < 1 || reps > 100) reps = 3;
    if (layers < 1 || dim < 64 || dim % 64 || vocab < 2) {
        fprintf(stderr, "bench_checkpoint: need --layers >= 1, --dim a multiple of 64, "
                        "--vocab >= 2\n");
        return 2;
    }
    /* A directory of its own, so removing it at the end removes only what
     * this run wrote. */
    char dir[1024];
    if (snprintf(dir, sizeof dir, "%s/bench_checkpoint.XXXXXX", parent) >= (int)sizeof dir ||
        !mkdtemp(dir)) {
        fprintf(stderr, "bench_checkpoint: cannot make a directory under %s: %s\n", parent,
                strerror(errno));
        return 1;
    }
    spmd_gpt_config cfg = {.vocab = vocab, .seq = 64, .context = 1024, .layers = layers,
                           .heads = dim / 64, .dim = dim};
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mesh *mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    spmd_gpt_tensors t;
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW};
    spmd_tensor *inputs[2];
    spmd_program *p = NULL;
    double *save = NULL, *load = NULL;
    if (!g || !mesh || spmd_gpt_build(g, &cfg, 8, &t) != SPMD_OK) goto fail;
    inputs[0] = t.input, inputs[1] = t.targets;
    if (spmd_fsdp_wrap(g, mesh, "fsdp", inputs, 2, NULL) != SPMD_OK ||
        spmd_graph_mark_output(g, t.loss) != SPMD_OK || spmd_grad(g, t.loss) != SPMD_OK ||
        spmd_optimizer_apply(g, &opt, NULL) != SPMD_OK)
        goto fail;
    spmd_compile_options copt = {0};
    if (!(p = spmd_compile(g, &copt))) goto fail;

    save = malloc(sizeof(double) * (size_t)reps), load = malloc(sizeof(double) * (size_t)reps);
    if (!save || !load) goto fail;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        if (spmd_checkpoint_save(p, dir, 1, NULL, 1) != SPMD_OK) goto fail;
        save[r] = now_s() - t0;
        t0 = now_s();
        if (spmd_checkpoint_load(p, dir, NULL, NULL) != SPMD_OK) goto fail;
        load[r] = now_s() - t0;
    }
    double bytes = checkpoint_bytes(dir);
    double dd = dd_rate(dir, bytes);
    double s = median(save, reps), l = median(load, reps);
    printf("checkpoint of a GPT of %d layers, dim %d, vocab %d (GPT-2 124M: 12, 768, 50257) + "
           "AdamW state on 4x2: "
           "%.0f MB in %s (removed after)\n",
           layers, dim, vocab, bytes / 1e6, dir);
    printf("save: median %.2f s = %.0f MB/s;  load: median %.2f s = %.0f MB/s  (%d reps)\n", s,
           bytes / s / 1e6, l, bytes / l / 1e6, reps);
    printf("dd write (1 MiB blocks, fsync) of the same bytes: %.0f MB/s;  save / dd = %.2f\n", dd,
           dd > 0 ? bytes / s / 1e6 / dd : 0);
    free(save), free(load);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    if (ckpt_remove_tree(dir, "bench_checkpoint") != SPMD_OK) {
        fprintf(stderr, "bench_checkpoint: %s\n", spmd_last_error());
        return 1;
    }
    return 0;
fail:
    fprintf(stderr, "bench_checkpoint: %s\n", spmd_last_error());
    free(save), free(load);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    ckpt_remove_tree(dir, "bench_checkpoint");
    return 1;
}
