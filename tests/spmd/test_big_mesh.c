/*
 * Big meshes: 256 device workers, more than the 128 threads OpenBLAS
 * supports inside it at once, follow the one-device losses; and a 16x16
 * FSDP mesh under a lowered address-space limit (RLIMIT_AS, `ulimit -v`)
 * runs or fails with a message naming the limit, and never hangs.
 *
 * The limited runs are children: this binary run again as
 * `test_big_mesh child CASE`, so each starts with no BLAS buffer mapped
 * (OpenBLAS maps them on first use), and the parent kills one that
 * outlives its deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

/* The 16x16 FSDP mesh: a sample per device.  dim 32, seq 16: the products
 * take OpenBLAS's buffered path, not its small-matrix kernels, so every
 * caller inside it holds one of its buffers. */
static const spmd_gpt_config SMALL = {.vocab = 32, .seq = 16, .layers = 1, .heads = 2, .dim = 32};
enum { SMALL_BATCH = 256 };

/* The 256-device mesh: a batch smaller than the mesh, as `spmd train
 * --mesh 256 --axes data` with its batch of 32, so every device works on
 * the whole batch: callers are often descheduled inside BLAS. */
static const spmd_gpt_config BIG = {.vocab = 32, .seq = 32, .layers = 1, .heads = 2, .dim = 96};
enum { BIG_BATCH = 8 };

enum { STEPS = 3 };

/* A run still going after this long hangs. */
enum { DEADLINE_S = 300 };

typedef struct run {
    spmd_graph *g;
    spmd_mesh *m;
    spmd_gpt_tensors t;
    spmd_tensor *lr;
    spmd_program *p;
    int tokens, vocab;
} run;

/* A GPT trained with SGD.  With a mesh the batch is split over every axis,
 * and with `fsdp_axis` the parameters are sharded over it. */
static spmd_status build(run *r, const spmd_gpt_config *cfg, int batch, const char *shape,
                         const char *axes, const char *fsdp_axis)
{
    memset(r, 0, sizeof *r);
    r->tokens = batch * cfg->seq;
    r->vocab = cfg->vocab;
    r->g = spmd_graph_create(NULL);
    if (!r->g) return SPMD_ERR_NOMEM;
    spmd_status st = spmd_gpt_build(r->g, cfg, batch, &r->t);
    if (st == SPMD_OK && shape) {
        r->m = spmd_mesh_parse(shape, axes);
        if (!r->m) return SPMD_ERR_INVALID;
        spmd_tensor *inputs[] = {r->t.input, r->t.targets};
        st = fsdp_axis ? spmd_fsdp_wrap(r->g, r->m, fsdp_axis, inputs, 2, NULL)
                       : spmd_shard_batch(r->g, r->m, inputs, 2, NULL);
    }
    if (st == SPMD_OK) st = spmd_graph_mark_output(r->g, r->t.loss);
    if (st == SPMD_OK) st = spmd_grad(r->g, r->t.loss);
    if (st == SPMD_OK) {
        r->lr = spmd_input(r->g, "lr", SPMD_F32, 0, NULL);
        st = spmd_sgd(r->g, r->lr);
    }
    return st;
}

/* Two threads in all, as on the smallest machine: 256 devices then get
 * one worker each. */
static spmd_status compile(run *r)
{
    r->p = spmd_compile(r->g, &(spmd_compile_options){.threads = 2, .seed = 3});
    if (!r->p) return SPMD_ERR_INVALID;
    float lr = 0.1f;
    return spmd_program_set_input(r->p, r->lr, &lr, sizeof lr);
}

static spmd_status step(run *r, int s, float *loss)
{
    int32_t *in = malloc((size_t)r->tokens * sizeof *in), *tg = malloc((size_t)r->tokens * sizeof *tg);
    spmd_status st = in && tg ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int i = 0; st == SPMD_OK && i < r->tokens; i++) {
        in[i] = (i * 7 + s * 3) % r->vocab;
        tg[i] = (i * 5 + s) % r->vocab;
    }
    size_t bytes = (size_t)r->tokens * sizeof *in;
    if (st == SPMD_OK) st = spmd_program_set_input(r->p, r->t.input, in, bytes);
    if (st == SPMD_OK) st = spmd_program_set_input(r->p, r->t.targets, tg, bytes);
    if (st == SPMD_OK) st = spmd_program_run(r->p);
    if (st == SPMD_OK) st = spmd_program_read(r->p, r->t.loss, loss, sizeof *loss);
    free(in);
    free(tg);
    return st;
}

static void release(run *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->m);
}

/* ---- Children ---------------------------------------------------------------- */

/* 256 device workers and one device: the same losses.  Prints them; exits
 * 0 if they agree, 1 if not or on an error. */
static int child_256_devices(void)
{
    /* All on one core, the most crowded case: a worker descheduled inside
     * BLAS stays there while the others run. */
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
        int first = 0;
        while (first < CPU_SETSIZE && !CPU_ISSET(first, &cpus)) first++;
        CPU_ZERO(&cpus);
        CPU_SET(first, &cpus);
        sched_setaffinity(0, sizeof cpus, &cpus);
    }
    run one, many;
    if (build(&one, &BIG, BIG_BATCH, NULL, NULL, NULL) != SPMD_OK ||
        build(&many, &BIG, BIG_BATCH, "256", "data", NULL) != SPMD_OK ||
        compile(&one) != SPMD_OK || compile(&many) != SPMD_OK) {
        printf("failed: %s\n", spmd_last_error());
        return 1;
    }
    int rc = spmd_program_devices(many.p) == 256 ? 0 : 1;
    for (int s = 0; rc == 0 && s < STEPS; s++) {
        float a, b;
        if (step(&one, s, &a) != SPMD_OK || step(&many, s, &b) != SPMD_OK) {
            printf("failed: step %d: %s\n", s, spmd_last_error());
            rc = 1;
            break;
        }
        printf("step %d: one device %.6f, 256 devices %.6f\n", s, a, b);
        if (!isfinite(a) || fabsf(a - b) > 1e-4f * fabsf(a)) rc = 1;
    }
    release(&one);
    release(&many);
    return rc;
}

static double mapped_bytes(void)
{
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return (double)pages * (double)sysconf(_SC_PAGESIZE);
}

/* Allow `headroom` bytes of address space past what is mapped now. */
static int limit_address_space(double headroom)
{
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) != 0) return -1;
    as.rlim_cur = (rlim_t)(mapped_bytes() + headroom);
    return setrlimit(RLIMIT_AS, &as);
}

/* The 16x16 FSDP mesh with the limit set before compiling (less than the
 * device threads' stacks), or after it with room for the program but not
 * for one OpenBLAS buffer ("tight"), or for a few ("roomy").  Prints "ran"
 * and exits 0, or prints "failed: MESSAGE" and exits 1; exits 2 if the
 * test itself went wrong. */
static int child_limited(const char *which)
{
    const double mib = 1024.0 * 1024.0;
    /* The BLAS library is loaded first: the limit is for its buffers, not
     * its code. */
    if (!spmd_blas_describe()) {
        printf("no BLAS: %s\n", spmd_last_error());
        return 2;
    }
    run r;
    if (build(&r, &SMALL, SMALL_BATCH, "16x16", "replica,fsdp", "fsdp") != SPMD_OK) {
        printf("build: %s\n", spmd_last_error());
        return 2;
    }
    bool before_compile = !strcmp(which, "compile");
    double headroom = before_compile ? 256 * mib : !strcmp(which, "tight") ? 64 * mib : 1024 * mib;
    if (before_compile && limit_address_space(headroom) != 0) return 2;
    spmd_status st = compile(&r);
    if (!before_compile && st == SPMD_OK && limit_address_space(headroom) != 0) return 2;
    float loss = 0;
    for (int s = 0; st == SPMD_OK && s < STEPS; s++) st = step(&r, s, &loss);
    if (st == SPMD_OK && isfinite(loss))
        printf("ran: loss %.4f\n", loss);
    else
        printf("failed: %s\n", st == SPMD_OK ? "loss is not finite" : spmd_last_error());
    release(&r);
    return st == SPMD_OK && isfinite(loss) ? 0 : 1;
}

/* Run this binary as `child which`, its stdout and stderr into out; false
 * if it outlived the deadline (it is killed). */
static bool run_child(const char *which, int *status, char *out, size_t size)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) skip(); /* no /proc: cannot start the children */
    self[len] = '\0';
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execl(self, self, "child", which, (char *)NULL);
        _exit(3);
    }
    close(fds[1]);
    /* Read as it comes, so a child that writes much never blocks. */
    size_t used = 0;
    bool done = false;
    time_t start = time(NULL);
    while (!done && time(NULL) - start < DEADLINE_S) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 100) > 0) {
            char buf[4096];
            ssize_t n = read(fds[0], buf, sizeof buf);
            size_t keep = n > 0 ? (size_t)n : 0;
            if (keep > size - 1 - used) keep = size - 1 - used;
            memcpy(out + used, buf, keep);
            used += keep;
        }
        pid_t w = waitpid(pid, status, WNOHANG);
        assert_true(w >= 0);
        done = w == pid;
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, status, 0);
    }
    for (ssize_t n; (n = read(fds[0], out + used, size - 1 - used)) > 0;) used += (size_t)n;
    out[used] = '\0';
    close(fds[0]);
    return done;
}

/* The child finished in time, by itself, and said what it did. */
static int expect_finished(const char *which, char *out, size_t size)
{
    int status = 0;
    bool done = run_child(which, &status, out, size);
    print_message("%s", out);
    if (!done) fail_msg("%s: no result within %d s: the run hangs", which, DEADLINE_S);
    if (WIFSIGNALED(status)) fail_msg("%s: killed by signal %d", which, WTERMSIG(status));
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* 256 device workers on two threads' worth of cores, more callers than
 * OpenBLAS's 128: the steps finish, OpenBLAS never runs out of buffers,
 * and the losses are the one-device run's. */
static void test_256_devices_follow_one_device(void **state)
{
    (void)state;
    static char out[1 << 16];
    assert_int_equal(expect_finished("256", out, sizeof out), 0);
    assert_null(strstr(out, "NUM_THREADS exceeded")); /* OpenBLAS past its table */
    assert_null(strstr(out, "memory regions"));
}

static void test_16x16_under_address_space_limit(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip(); /* sanitizers reserve terabytes of address space */
#endif
    const char *cases[] = {"compile", "tight", "roomy"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[8192];
        print_message("%s: ", cases[i]);
        int code = expect_finished(cases[i], out, sizeof out);
        if (code == 0) {
            assert_non_null(strstr(out, "ran"));
        } else {
            assert_int_equal(code, 1);
            assert_non_null(strstr(out, "ulimit -v"));
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "child"))
        return !strcmp(argv[2], "256") ? child_256_devices() : child_limited(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_256_devices_follow_one_device),
        cmocka_unit_test(test_16x16_under_address_space_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
