/*
 * The chaos run: `spmd train` saving a checkpoint every 3 steps (--keep
 * 2, --log) is killed with SIGKILL twenty times at seeded random moments,
 * and resumed (--resume) after each kill: in start-up, in the lock of
 * --save, in a step, in a save; one process alone, or one of two under
 * mpirun (every fifth kill, when built with MPI; the other process is
 * mpirun's to end).  Then it runs to its end.  Checked:
 *
 *   - after every kill, every checkpoint in --save reads back whole (`spmd
 *     export` of each step directory new or changed since its last check
 *     reads every byte against its crc32 and loads the weights), `latest`
 *     names one of them, and --save holds nothing else but the lock and
 *     what killed runs left (a save's temporaries, the probe of a run
 *     killed as it checked that --save takes files), which the next run
 *     removes;
 *   - after every kill, nothing outside --save and the log has changed:
 *     the run's directory (its input text, a file and a folder beside it)
 *     is snapshotted, every entry's name, type, mode, size and contents;
 *   - at the end, the last checkpoint's files are an uninterrupted run's
 *     (same flags, one process), byte for byte; every line of the log
 *     equals the uninterrupted run's line of its step (step, loss, lr,
 *     grad_norm: the timing fields aside), each step logged at least once;
 *     --save holds the lock, `latest` and two step directories only.
 *
 * Where each kill landed is spmd-test's record (SPMD_TEST_PHASES, see
 * tools/test_hooks.h): every process appends a line with a timestamp as
 * it enters each phase (start, lock, step N, save N, each stage of the
 * save, saved N).  The victim's last line before the kill, and the time
 * since it, is where the kill landed; a kill in the lock, and half of
 * those in start-up, stop the tool first (SPMD_TEST_PHASE_STOP): in the
 * lock, or as it probes --save with a file of its own.  The test prints every kill's aim
 * and landing, and the seed: SPMD_TEST_SEED=N replays the same aims (the
 * moments depend on the machine's timing too); SPMD_TEST_CHAOS_KILLS=N
 * runs N kills (the long form; the short form, 20 kills, takes about 20 s
 * on 2 cores).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support_files.h"
#include "support_mpi.h"
#include "support_rng.h"
#include "support_tool.h"

#if defined(SPMD_TOOL_PATH) && defined(SPMD_TEST_TOOL_PATH)

enum {
    DEFAULT_KILLS = 20,
    SAVE_EVERY = 3,
    /* A kill round aims at most this many steps past the last checkpoint
     * (and at the next two saves), so the run never ends in one: --steps
     * is MAX_AHEAD + SAVE_EVERY per kill, and some. */
    MAX_AHEAD = 4,
    ROUND_TIMEOUT_S = 120,
    MAX_LINES = 4096, /* phase lines read back per round */
};

#define DEFAULT_SEED 20261205u
#define TRAIN_FLAGS                                                                                \
    "--data text.txt --mesh 2x2 --axes replica,fsdp --eval 0 --batch 8 --seq 16 --dim 16 "        \
    "--heads 2 --layers 1 --keep 2 --log-every 1000"

static char *dir;                 /* the test's scratch */
static char run_dir[SUPPORT_PATH]; /* the run's working directory: its input, --save, --log */
static char phases[SUPPORT_PATH]; /* SPMD_TEST_PHASES */
static char output[SUPPORT_PATH]; /* the runs' stdout and stderr */
static int steps;                 /* --steps of every run */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void nap_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* ---- The run's directory, snapshotted ------------------------------------------------------ */

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* One line per entry under `path` (relative name `rel`), sorted by name,
 * appended to *text; --save (ck) and the log (train.jsonl) left out. */
static void snapshot_into(const char *path, const char *rel, char **text, size_t *len)
{
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        char sub[SUPPORT_PATH], subrel[SUPPORT_PATH];
        bool skip = !strcmp(name, ".") || !strcmp(name, "..") ||
                    (!*rel && (!strcmp(name, "ck") || !strcmp(name, "train.jsonl")));
        snprintf(sub, sizeof sub, "%s/%s", path, name);
        snprintf(subrel, sizeof subrel, "%s%s%s", rel, *rel ? "/" : "", name);
        free(names[i]);
        if (skip) continue;
        struct stat st;
        assert_int_equal(lstat(sub, &st), 0);
        uint64_t h = 14695981039346656037ull;
        if (S_ISREG(st.st_mode)) {
            size_t flen;
            char *data = support_read_file(sub, &flen);
            h = fnv(data, flen, h);
            free(data);
        }
        char line[SUPPORT_PATH + 96];
        int k = snprintf(line, sizeof line, "%s %o %lld %016llx\n", subrel, (unsigned)st.st_mode,
                         (long long)st.st_size, (unsigned long long)h);
        *text = realloc(*text, *len + (size_t)k + 1);
        assert_non_null(*text);
        memcpy(*text + *len, line, (size_t)k + 1);
        *len += (size_t)k;
        if (S_ISDIR(st.st_mode)) snapshot_into(sub, subrel, text, len);
    }
    free(names);
}

static char *snapshot(void)
{
    char *text = calloc(1, 1);
    size_t len = 0;
    snapshot_into(run_dir, "", &text, &len);
    return text;
}

/* ---- Phases: where each process is -------------------------------------------------------- */

typedef struct phase_line {
    int rank;
    long pid;
    double t;
    char what[96]; /* "step 5", "save 9 dev-0001.safetensors" */
} phase_line;

/* The lines appended to the phases file since byte `from`. */
static int read_phases(long from, phase_line *lines, int most)
{
    FILE *f = fopen(phases, "r");
    if (!f) return 0;
    fseek(f, from, SEEK_SET);
    int n = 0;
    char buf[256];
    while (n < most && fgets(buf, sizeof buf, f)) {
        phase_line *l = &lines[n];
        if (buf[strlen(buf) - 1] != '\n') break; /* being written */
        buf[strcspn(buf, "\n")] = '\0';
        if (sscanf(buf, "P%d %ld %lf %95[^\n]", &l->rank, &l->pid, &l->t, l->what) == 4) n++;
    }
    fclose(f);
    return n;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* ---- Starting a run --------------------------------------------------------------------- */

/* spmd-test train over `procs` processes in run_dir, resuming when --save
 * has a checkpoint; `stop` the SPMD_TEST_PHASE_STOP (or NULL). */
static pid_t start_run(int procs, const char *stop)
{
    char latest[SUPPORT_PATH], cmd[4096], mpirun[2048] = "";
    struct stat st;
    bool resume = stat(support_path_in(latest, run_dir, "ck/latest"), &st) == 0;
#ifdef SPMD_MPIEXEC
    if (procs > 1) support_mpirun(mpirun, sizeof mpirun, ROUND_TIMEOUT_S);
#endif
    assert_true(procs == 1 || mpirun[0]);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && exec %s %s '%s' train " TRAIN_FLAGS " --threads %d --steps %d --save ck "
             "--save-every %d --log train.jsonl %s >>'%s' 2>&1",
             run_dir, mpirun, procs > 1 ? "-n 2" : "", SPMD_TEST_TOOL_PATH, 2 / procs, steps,
             SAVE_EVERY, resume ? "--resume ck" : "", output);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("SPMD_TEST_PHASES", phases, 1);
        if (stop) setenv("SPMD_TEST_PHASE_STOP", stop, 1);
        else unsetenv("SPMD_TEST_PHASE_STOP");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The run's exit status, waiting at most `seconds`; -1 if still running. */
static int wait_run(pid_t pid, double seconds)
{
    for (double t0 = now_s();; nap_s(0.005)) {
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_s() - t0 > seconds) return -1;
    }
}

/* ---- The uninterrupted run ----------------------------------------------------------------- */

/* Its step time and save time (medians, seconds) and start-up (first
 * "start" to "step 1"), for aiming. */
static double step_s, save_s, startup_s;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* In its own directory, with a copy of the input text: the same flags
 * to the letter (the checkpoint's index records --data as given). */
static void reference(const char *text)
{
    char ref[SUPPORT_PATH], copy[SUPPORT_PATH];
    support_path_in(ref, dir, "ref");
    assert_int_equal(mkdir(ref, 0755), 0);
    write_text(support_path_in(copy, ref, "text.txt"), text);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "-c \"cd '%s' && SPMD_TEST_PHASES='%s' exec '%s' train " TRAIN_FLAGS
             " --threads 2 --steps %d --save ck --save-every %d --log train.jsonl\"",
             ref, phases, SPMD_TEST_TOOL_PATH, steps, SAVE_EVERY);
    static char out[1 << 16];
    int rc = support_run_tool("/bin/sh", cmd, NULL, out, sizeof out);
    if (rc != 0) fail_msg("the uninterrupted run: exit %d\n%s", rc, out);
    static phase_line lines[1 << 14];
    int n = read_phases(0, lines, 1 << 14);
    double steps_t[1 << 12], saves_t[1 << 10], t_start = 0, t_step1 = 0, t_save = 0;
    int ns = 0, nv = 0;
    for (int i = 0; i < n; i++) {
        const char *w = lines[i].what;
        if (!strcmp(w, "start")) t_start = lines[i].t;
        else if (!strcmp(w, "step 1")) t_step1 = lines[i].t;
        if (!strncmp(w, "step ", 5) && i + 1 < n && !strncmp(lines[i + 1].what, "step ", 5) &&
            ns < (int)(sizeof steps_t / sizeof *steps_t))
            steps_t[ns++] = lines[i + 1].t - lines[i].t;
        if (!strncmp(w, "save ", 5) && !strchr(w + 5, ' ')) t_save = lines[i].t;
        if (!strncmp(w, "saved ", 6) && nv < (int)(sizeof saves_t / sizeof *saves_t))
            saves_t[nv++] = lines[i].t - t_save;
    }
    assert_true(ns > 0 && nv > 0 && t_step1 > t_start);
    qsort(steps_t, (size_t)ns, sizeof *steps_t, cmp_double);
    qsort(saves_t, (size_t)nv, sizeof *saves_t, cmp_double);
    step_s = steps_t[ns / 2], save_s = saves_t[nv / 2], startup_s = t_step1 - t_start;
    print_message("uninterrupted run: %d steps; start-up %.0f ms, a step %.1f ms, a save %.1f ms\n",
                  steps, startup_s * 1e3, step_s * 1e3, save_s * 1e3);
    remove(phases);
}

/* ---- After a kill ------------------------------------------------------------------------- */

/* Step directories already read back, by name and fingerprint. */
typedef struct checked {
    char name[32];
    uint64_t print;
} checked;
static checked seen[4096];
static int n_seen;

/* The names, sizes and modification times of a directory's files. */
static uint64_t fingerprint(const char *path)
{
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    assert_true(n >= 0);
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < n; i++) {
        char f[SUPPORT_PATH];
        struct stat st;
        support_path_in(f, path, names[i]->d_name);
        if (stat(f, &st) == 0) {
            h = fnv(names[i]->d_name, strlen(names[i]->d_name), h);
            h = fnv(&st.st_size, sizeof st.st_size, h);
            h = fnv(&st.st_mtim, sizeof st.st_mtim, h);
            h = fnv(&st.st_ino, sizeof st.st_ino, h);
        }
        free(names[i]);
    }
    free(names);
    return h;
}

/* Every checkpoint in --save reads back; `latest` names one; nothing
 * else is there but the lock and killed saves' temporaries (counted in
 * *temporaries).  Returns the step `latest` names (0: none). */
static int check_checkpoints(const char *when, int *temporaries)
{
    char ck[SUPPORT_PATH];
    support_path_in(ck, run_dir, "ck");
    *temporaries = 0;
    DIR *d = opendir(ck);
    if (!d) return 0; /* killed before --save was made */
    int latest_step = 0, steps_here = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *name = e->d_name;
        char path[SUPPORT_PATH];
        support_path_in(path, ck, name);
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, ".lock")) continue;
        if (!strncmp(name, ".tmp-step-", 10) || !strncmp(name, ".del-step-", 10) ||
            !strncmp(name, ".latest.tmp-", 12) || !strncmp(name, ".write-test-", 12)) {
            (*temporaries)++;
            continue;
        }
        if (!strcmp(name, "latest")) {
            size_t len;
            char *text = support_read_file(path, &len);
            if (sscanf(text, "step-%d", &latest_step) != 1)
                fail_msg("%s: latest holds '%s'", when, text);
            free(text);
            continue;
        }
        if (strncmp(name, "step-", 5)) fail_msg("%s: --save holds '%s'", when, name);
        steps_here++;
        uint64_t print = fingerprint(path);
        int i = 0;
        while (i < n_seen && (strcmp(seen[i].name, name) || seen[i].print != print)) i++;
        if (i < n_seen) continue;
        char args[4096], out[8192], to[SUPPORT_PATH];
        support_path_in(to, dir, "check.safetensors");
        snprintf(args, sizeof args, "export '%s' --out '%s'", path, to);
        int rc = support_run_tool(SPMD_TOOL_PATH, args, NULL, out, sizeof out);
        if (rc != 0) fail_msg("%s: checkpoint %s does not read back (exit %d):\n%s", when, name, rc, out);
        assert_true(n_seen < (int)(sizeof seen / sizeof *seen));
        assert_true(strlen(name) < sizeof seen[n_seen].name);
        strcpy(seen[n_seen].name, name);
        seen[n_seen++].print = print;
    }
    closedir(d);
    if (latest_step) {
        char named[SUPPORT_PATH], index[64];
        snprintf(index, sizeof index, "step-%08d/index.json", latest_step);
        support_path_in(named, ck, index);
        struct stat st;
        if (stat(named, &st) != 0) fail_msg("%s: latest names step %d, which is not there", when, latest_step);
    } else if (steps_here) {
        fail_msg("%s: step directories but no latest", when);
    }
    return latest_step;
}

/* ---- The log ----------------------------------------------------------------------------- */

/* The text of "key":VALUE in a log line (the value up to ',' or '}'). */
static bool field(const char *line, const char *key, char *value, size_t size)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(line, pat);
    if (!at) return false;
    at += strlen(pat);
    size_t n = strcspn(at, ",}");
    snprintf(value, size, "%.*s", (int)n, at);
    return true;
}

/* A log line's step and the fields compared ("loss lr grad_norm"); false
 * for a line that is not a whole step line. */
static bool log_line(const char *line, int *step, char *values, size_t size)
{
    char s[32], loss[48], lr[48], norm[48];
    size_t len = strlen(line);
    if (len < 2 || line[0] != '{' || line[len - 1] != '}') return false;
    if (!field(line, "step", s, sizeof s) || !field(line, "loss", loss, sizeof loss) ||
        !field(line, "lr", lr, sizeof lr) || !field(line, "grad_norm", norm, sizeof norm))
        return false;
    *step = atoi(s);
    int n = snprintf(values, size, "loss %s lr %s grad_norm %s", loss, lr, norm);
    assert_true(n > 0 && (size_t)n < size);
    return *step >= 1;
}

typedef char log_values[160];

/* The uninterrupted run's lines by step (1..steps). */
static log_values *want;

static void read_reference_log(void)
{
    char path[SUPPORT_PATH];
    support_path_in(path, dir, "ref/train.jsonl");
    size_t len;
    char *text = support_read_file(path, &len);
    want = calloc((size_t)steps + 1, sizeof *want);
    assert_non_null(want);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int step;
        log_values v;
        if (!log_line(line, &step, v, sizeof v) || step != n + 1)
            fail_msg("the uninterrupted run's log, line %d: %s", n + 1, line);
        snprintf(want[step], sizeof want[step], "%s", v);
        n++;
    }
    free(text);
    assert_int_equal(n, steps);
}

/* Every line of the chaos run's log is whole and equals the uninterrupted
 * run's line of its step; returns the steps logged (each at least once
 * counted once) and the lines in *lines. */
static int check_log(const char *when, int *lines)
{
    char path[SUPPORT_PATH];
    support_path_in(path, run_dir, "train.jsonl");
    struct stat st;
    *lines = 0;
    if (stat(path, &st) != 0) return 0;
    size_t len;
    char *text = support_read_file(path, &len);
    if (len && text[len - 1] != '\n') fail_msg("%s: the log ends in a torn line", when);
    bool *logged = calloc((size_t)steps + 1, 1);
    int distinct = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int step;
        log_values v;
        (*lines)++;
        if (!log_line(line, &step, v, sizeof v) || step > steps)
            fail_msg("%s: log line %d is not a step's line: %s", when, *lines, line);
        if (strcmp(v, want[step]))
            fail_msg("%s: log line %d, step %d: %s; the uninterrupted run: %s", when, *lines, step,
                     v, want[step]);
        if (!logged[step]) distinct++;
        logged[step] = true;
    }
    free(logged);
    free(text);
    return distinct;
}

/* ---- A kill ------------------------------------------------------------------------------ */

typedef enum aim { AIM_START, AIM_LOCK, AIM_STEP, AIM_SAVE, N_AIMS } aim;
static const char *const aim_names[N_AIMS] = {"start-up", "the lock", "a step", "a save"};

typedef struct kill_record {
    int procs, victim;
    char aimed[48], landed[112];
    double after_ms; /* the kill's time after the victim's last phase line */
    int temporaries; /* what killed runs left in --save, after it */
} kill_record;

/* Whether process `pid` runs (a zombie has ended). */
static bool alive(pid_t pid)
{
    char path[64], stat_text[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill(pid, 0) == 0 && errno != ESRCH;
    size_t n = fread(stat_text, 1, sizeof stat_text - 1, f);
    fclose(f);
    stat_text[n] = '\0';
    const char *paren = strrchr(stat_text, ')'); /* the state follows "(comm)" */
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* The victim's pid and line index of phase `what` (NULL: any line of the
 * victim) since `from`; 0 while not there. */
static long find_phase(long from, int victim, const char *what, phase_line *lines, int *n)
{
    *n = read_phases(from, lines, MAX_LINES);
    for (int i = 0; i < *n; i++)
        if (lines[i].rank == victim && (!what || !strcmp(lines[i].what, what))) return lines[i].pid;
    return 0;
}

static void kill_once(test_rng *r, int k, int first, kill_record *rec)
{
    static phase_line lines[MAX_LINES];
    int n;
    rec->procs = 1;
#ifdef SPMD_MPIEXEC
    if (k % 5 == 4) rec->procs = 2;
#endif
    aim a = (aim)test_rng_int(r, 0, N_AIMS - 1);
    rec->victim = rec->procs == 1 ? 0 : test_rng_int(r, 0, 1);
    char what[48] = "start";
    double delay = 0;
    bool stop = a == AIM_LOCK;
    switch (a) {
    case AIM_START:
        /* Half of them stopped in the probe of --save (a file there). */
        if ((stop = test_rng_chance(r, 0.5))) snprintf(what, sizeof what, "probe");
        else delay = test_rng_unit(r) * startup_s;
        break;
    case AIM_LOCK: snprintf(what, sizeof what, "lock"); break;
    case AIM_STEP:
        snprintf(what, sizeof what, "step %d", first + test_rng_int(r, 1, MAX_AHEAD));
        delay = test_rng_unit(r) * 2 * step_s;
        break;
    case AIM_SAVE:
        snprintf(what, sizeof what, "save %d",
                 (first / SAVE_EVERY + test_rng_int(r, 1, 2)) * SAVE_EVERY);
        delay = test_rng_unit(r) * save_s;
        break;
    case N_AIMS: break;
    }
    if (stop) rec->victim = 0; /* process 0 alone probes and locks --save */
    int n_aim = snprintf(rec->aimed, sizeof rec->aimed, "%s (%s%s)", aim_names[a], what,
                         stop ? ", stopped there" : "");
    assert_true(n_aim > 0 && (size_t)n_aim < sizeof rec->aimed);
    char stop_at[64];
    snprintf(stop_at, sizeof stop_at, "0:%s", what);
    long from = file_size(phases);
    pid_t job = start_run(rec->procs, stop ? stop_at : NULL);
    long victim = 0;
    for (double t0 = now_s(); !(victim = find_phase(from, rec->victim, what, lines, &n));
         nap_s(0.0005)) {
        int rc = wait_run(job, 0);
        if (rc >= 0) {
            char tail[SUPPORT_PATH];
            fail_msg("kill %d: the run ended (exit %d) before %s; see %s", k + 1, rc, what,
                     support_path_in(tail, dir, "runs.txt"));
        }
        if (now_s() - t0 > ROUND_TIMEOUT_S) fail_msg("kill %d: no '%s' in %d s", k + 1, what, ROUND_TIMEOUT_S);
    }
    if (delay > 0) nap_s(delay);
    double t_kill = now_s();
    assert_int_equal(kill((pid_t)victim, SIGKILL), 0);
    int rc = wait_run(job, ROUND_TIMEOUT_S);
    if (rc < 0) {
        kill(job, SIGKILL);
        fail_msg("kill %d: the job did not end within %d s of killing process %d", k + 1,
                 ROUND_TIMEOUT_S, rec->victim);
    }
    /* Where it landed: the victim's last line (it is dead: the file holds
     * all of them). */
    n = read_phases(from, lines, MAX_LINES);
    const phase_line *last = NULL;
    for (int i = 0; i < n; i++)
        if (lines[i].pid == victim) last = &lines[i];
    assert_non_null(last);
    rec->after_ms = (t_kill - last->t) * 1e3;
    snprintf(rec->landed, sizeof rec->landed, "%s", last->what);
    /* The job's other process is gone too (mpirun may leave its end to
     * the signals it sent: a few seconds). */
    for (int i = 0; i < n; i++)
        for (double t = now_s(); lines[i].pid != victim && alive((pid_t)lines[i].pid); nap_s(0.01))
            if (now_s() - t > 10)
                fail_msg("kill %d: process %d (pid %ld) outlived its job by 10 s", k + 1,
                         lines[i].rank, lines[i].pid);
}

/* ---- The test ----------------------------------------------------------------------------- */

static void test_chaos(void **state)
{
    (void)state;
    uint64_t seed = test_announce_seed("test_cli_chaos", DEFAULT_SEED);
    const char *env = getenv("SPMD_TEST_CHAOS_KILLS");
    int kills = env && atoi(env) > 0 ? atoi(env) : DEFAULT_KILLS;
    steps = kills * (MAX_AHEAD + SAVE_EVERY) + 10;
    test_rng r = test_rng_for(seed, "chaos");
    dir = support_temp_dir("spmd-chaos");
    support_path_in(run_dir, dir, "run");
    support_path_in(phases, dir, "phases.txt");
    support_path_in(output, dir, "runs.txt");
    assert_int_equal(mkdir(run_dir, 0755), 0);
    /* The run's input and its neighbours, which nothing may touch. */
    char path[SUPPORT_PATH];
    char *text = malloc(1 << 15);
    assert_non_null(text);
    static const char *const words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "ran"};
    size_t len = 0;
    while (len < (1 << 15) - 16)
        len += (size_t)sprintf(text + len, "%s ", words[test_rng_int(&r, 0, 7)]);
    write_text(support_path_in(path, run_dir, "text.txt"), text);
    write_text(support_path_in(path, run_dir, "notes.txt"), "kept as it is\n");
    assert_int_equal(mkdir(support_path_in(path, run_dir, "folder"), 0700), 0);
    write_text(support_path_in(path, run_dir, "folder/inside.txt"), "kept too\n");

    reference(text);
    free(text);
    read_reference_log();
    char *before = snapshot();
    kill_record *recs = calloc((size_t)kills, sizeof *recs);
    assert_non_null(recs);
    int first = 0, lines = 0;
    double t0 = now_s();
    for (int k = 0; k < kills; k++) {
        char when[64];
        snprintf(when, sizeof when, "after kill %d", k + 1);
        kill_once(&r, k, first, &recs[k]);
        first = check_checkpoints(when, &recs[k].temporaries);
        char *after = snapshot();
        if (strcmp(before, after))
            fail_msg("%s: the run's directory changed outside --save and the log:\nbefore\n%safter\n%s",
                     when, before, after);
        free(after);
        check_log(when, &lines);
        print_message("kill %2d: %d process%s%s, aimed at %s: landed in '%s' +%.2f ms; latest "
                      "step %d%s\n",
                      k + 1, recs[k].procs, recs[k].procs > 1 ? "es" : "",
                      recs[k].procs > 1 ? (recs[k].victim ? ", process 1 killed" : ", process 0 killed") : "",
                      recs[k].aimed, recs[k].landed, recs[k].after_ms, first,
                      recs[k].temporaries ? ", leftovers in --save" : "");
    }
    /* To the end, undisturbed. */
    pid_t job = start_run(1, NULL);
    int rc = wait_run(job, ROUND_TIMEOUT_S);
    if (rc != 0) fail_msg("the last run: exit %d; see %s", rc, output);
    int temporaries;
    int last = check_checkpoints("at the end", &temporaries);
    assert_int_equal(last, steps);
    if (temporaries) fail_msg("at the end: --save still holds %d temporaries", temporaries);
    char *after = snapshot();
    if (strcmp(before, after)) fail_msg("at the end: the run's directory changed:\n%s\n%s", before, after);
    free(after);
    free(before);
    int distinct = check_log("at the end", &lines);
    assert_int_equal(distinct, steps);
    /* The last checkpoint, file by file. */
    char mine[SUPPORT_PATH], theirs[SUPPORT_PATH], name[64];
    snprintf(name, sizeof name, "ck/step-%08d", steps);
    support_path_in(mine, run_dir, name);
    snprintf(name, sizeof name, "ref/ck/step-%08d", steps);
    support_path_in(theirs, dir, name);
    struct dirent **names;
    int n = scandir(theirs, &names, NULL, alphasort), compared = 0;
    assert_true(n > 2);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char a[SUPPORT_PATH], b[SUPPORT_PATH];
            size_t la, lb;
            support_path_in(a, mine, names[i]->d_name);
            support_path_in(b, theirs, names[i]->d_name);
            char *x = support_read_file(a, &la), *y = support_read_file(b, &lb);
            if (la != lb || memcmp(x, y, la))
                fail_msg("the last checkpoint's %s differs from the uninterrupted run's", names[i]->d_name);
            free(x), free(y);
            compared++;
        }
        free(names[i]);
    }
    free(names);
    assert_int_equal(support_count_entries(mine, "") - 2, compared); /* and . and .. */
    /* Where the kills landed. */
    int by_place[5] = {0}, in_mpi = 0;
    for (int k = 0; k < kills; k++) {
        const char *l = recs[k].landed;
        int place = !strcmp(l, "start") || !strcmp(l, "probe") || !strcmp(l, "prepared") ? 0 : !strcmp(l, "lock") ? 1 : !strncmp(l, "step ", 5) ? 2
                  : !strncmp(l, "save ", 5) ? 3 : 4;
        by_place[place]++;
        in_mpi += recs[k].procs > 1;
    }
    print_message("%d kills in %.1f s (%d of them of one process of two under mpirun): %d in "
                  "start-up, %d in the lock, %d in a step, %d in a save, %d just after a save; "
                  "%d log lines for %d steps; the last checkpoint's %d files and the log equal "
                  "the uninterrupted run's\n",
                  kills, now_s() - t0, in_mpi, by_place[0], by_place[1], by_place[2], by_place[3],
                  by_place[4], lines, steps, compared);
    free(recs);
    free(want);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_chaos)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static void test_skipped(void **state)
{
    (void)state;
    print_message("built without the tool: the chaos run is not tested\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
