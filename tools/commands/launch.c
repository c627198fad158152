/*
 * `spmd launch [flags] [--] COMMAND...`: a job over processes and hosts
 * through Open MPI's mpirun, as torchrun is to PyTorch.  COMMAND is a
 * command of this spmd (train, sample, explain: this binary runs it, at
 * the same path on every host) or any program (python3 script.py).  The
 * mpirun line carries what libspmd needs and what bounds the detection of
 * a failure:
 *
 *   -n, --host/--hostfile  where the processes go (launch_hosts.h), by
 *                          slot: consecutive ranks share a host, so the
 *                          minor mesh axes stay inside it
 *   --bind-to none         the processes share their host's cores: each
 *                          divides them (spmd's threads), a binding would
 *                          squeeze its threads onto one core
 *   --oversubscribe        on this host alone: processes may outnumber
 *                          cores, for the same reason
 *   oob_tcp_keepalive_*    Open MPI's daemons' connections probed
 *                          (KEEPALIVE_* below)
 *   btl/oob_tcp_if_include --subnet: the processes' and the daemons' TCP
 *
 * Open MPI 4.1 (Debian 12) runs its daemons with ORTE, 5 (Debian 13) with
 * PRRTE: the out-of-band settings are ORTE's --mca, PRRTE's --prtemca;
 * the release is asked of mpirun (--version).  The line is printed (on
 * stderr; --dry-run on: on stdout, and nothing runs), then run and
 * watched to its end (launch_watch.h).
 */
#include "commands/launch.h"

#include "flags.h"
#include "launch_hosts.h"
#include "launch_watch.h"
#include "message.h"
#include "paths.h"

#include "spmd/spmd.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Open MPI's daemons keep TCP connections to mpirun and each other,
 * mostly idle while the job runs.  Keepalive probes start after TIME
 * idle seconds, one every INTVL, and PROBES missed declare the daemon
 * lost, which ends the job: a host that stops answering while no message
 * is in flight is noticed within 60 + 6 x 20 = 180 s of the last traffic
 * (Open MPI's own 300, 20, 9: 480 s).  Never sooner than 120 s after it
 * stopped: the collective watchdog (100 s by default) fires first and
 * names the host and the collective.  Once a message is in flight (the
 * abort that follows the watchdog), keepalive no longer applies; the
 * watch does (launch_watch.h). */
#define KEEPALIVE_TIME_S 60
#define KEEPALIVE_INTVL_S 20
#define KEEPALIVE_PROBES 6
_Static_assert(KEEPALIVE_INTVL_S * KEEPALIVE_PROBES > SPMD_COLLECTIVE_TIMEOUT_S,
               "keepalive would end a job cut off from a host before the watchdog names it");

/* The commands of spmd that run over processes. */
#define LAUNCHED_COMMANDS (CMD_TRAIN | CMD_EXPLAIN | CMD_SAMPLE)

/* ---- The words of the line ---------------------------------------------------------------- */

typedef struct words {
    char **w; /* NULL-terminated */
    int n, cap;
} words;

static int add(words *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add(words *l, const char *fmt, ...)
{
    if (l->n + 2 > l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **grown = realloc(l->w, (size_t)cap * sizeof *grown);
        if (!grown) return cli_fail("out of memory");
        l->w = grown, l->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&l->w[l->n], fmt, ap);
    va_end(ap);
    if (rc < 0) return cli_fail("out of memory");
    l->w[++l->n] = NULL;
    return 0;
}

static void words_free(words *l)
{
    for (int i = 0; i < l->n; i++) free(l->w[i]);
    free(l->w);
}

/* The line as a shell would take it back: a word with anything but
 * [A-Za-z0-9_./:=,@%+-] in single quotes. */
static void print_line(FILE *f, const char *lead, const words *l)
{
    fputs(lead, f);
    for (int i = 0; i < l->n; i++) {
        const char *w = l->w[i];
        bool plain = *w != '\0';
        for (const char *c = w; *c && plain; c++)
            plain = isalnum((unsigned char)*c) || strchr("_./:=,@%+-", *c);
        if (i) fputc(' ', f);
        if (plain) {
            fputs(w, f);
            continue;
        }
        fputc('\'', f);
        for (const char *c = w; *c; c++)
            if (*c == '\'') fputs("'\\''", f);
            else fputc(*c, f);
        fputc('\'', f);
    }
    fputc('\n', f);
    fflush(f);
}

/* ---- mpirun's release --------------------------------------------------------------------- */

/* Open MPI's major version from `mpirun --version` ("mpirun (Open MPI)
 * 4.1.4"; 5's prterun says PRRTE's own, and is not taken): 0, or 2 with
 * a message. */
static int mpirun_release(const char *mpirun, int *major)
{
    static const char CANNOT_RUN[] = "cannot run it: ";
    int out[2];
    if (pipe(out) != 0) return cli_fail("cannot make a pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(out[0]), close(out[1]);
        return cli_fail("cannot start %s: %s", mpirun, strerror(errno));
    }
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(out[1], STDERR_FILENO);
        close(out[0]), close(out[1]);
        execlp(mpirun, mpirun, "--version", (char *)NULL);
        dprintf(STDOUT_FILENO, "%s%s\n", CANNOT_RUN, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    char text[4096];
    size_t len = 0;
    for (ssize_t n; len < sizeof text - 1 && (n = read(out[0], text + len, sizeof text - 1 - len));) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        len += (size_t)n;
    }
    text[len] = '\0';
    close(out[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    /* 4.1's mpiexec calls itself OpenRTE's. */
    static const char *const names[] = {"(Open MPI) ", "(OpenRTE) "};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *at = strstr(text, names[i]);
        if (at) *major = atoi(at + strlen(names[i]));
    }
    if (*major >= 3) return 0;
    text[strcspn(text, "\n")] = '\0';
    if (!strncmp(text, CANNOT_RUN, strlen(CANNOT_RUN)))
        return cli_fail("--mpirun %s: %s (Open MPI's: apt-get install openmpi-bin)", mpirun, text);
    return cli_fail("--mpirun %s: not Open MPI's mpirun 3 or later (its --version says '%s'): spmd "
                    "launch passes Open MPI's settings", mpirun, text);
}

/* ---- The line ----------------------------------------------------------------------------- */

/* Where the processes go: -n and the hosts, mapped by slot. */
static int add_placement(const cli_opts *o, const launch_hosts *h, bool prrte, words *l)
{
    int rc = 0;
    if (h->file) {
        if (o->launch_n) rc = add(l, "-n") || add(l, "%d", o->launch_n);
        if (!rc) rc = add(l, "--hostfile") || add(l, "%s", h->file);
        if (!rc && o->per_host) return add(l, "--map-by") || add(l, "ppr:%d:node", o->per_host);
        return rc ? rc : add(l, "--map-by") || add(l, "slot");
    }
    if (h->n) {
        long slots = o->per_host ? (long)o->per_host * h->n : launch_hosts_slots(h);
        long n = o->launch_n ? o->launch_n : h->tasks && !o->per_host ? h->tasks : slots;
        if (n > slots)
            return cli_fail("-n %ld is more than the %ld slots of the %d hosts of %s%s", n, slots,
                            h->n, h->source, o->per_host ? ", --per-host's" : "");
        if (n > INT_MAX) return cli_fail("%s holds more than %d slots", h->source, INT_MAX);
        char *list = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&list, &size);
        if (!f) return cli_fail("out of memory");
        for (int i = 0; i < h->n; i++)
            fprintf(f, "%s%s:%d", i ? "," : "", h->host[i].name,
                    o->per_host ? o->per_host : h->host[i].slots);
        if (fclose(f) != 0 || !list) return cli_fail("out of memory");
        rc = add(l, "-n") || add(l, "%ld", n) || add(l, "--host") || add(l, "%s", list);
        free(list);
        return rc ? rc : add(l, "--map-by") || add(l, "slot");
    }
    /* This host alone. */
    if (o->launch_n && o->per_host && o->launch_n != o->per_host)
        return cli_fail("-n %d and --per-host %d on one host: give one of them", o->launch_n,
                        o->per_host);
    int n = o->launch_n ? o->launch_n : o->per_host ? o->per_host : 1;
    rc = add(l, "-n") || add(l, "%d", n) || add(l, "--map-by");
    if (prrte) return rc ? rc : add(l, "slot:OVERSUBSCRIBE");
    return rc ? rc : add(l, "slot") || add(l, "--oversubscribe");
}

/* An Open MPI setting of the daemons' out-of-band channel: ORTE's --mca,
 * PRRTE's --prtemca. */
static int add_oob(words *l, bool prrte, const char *key, const char *value)
{
    return add(l, "%s", prrte ? "--prtemca" : "--mca") || add(l, "%s", key) ||
           add(l, "%s", value);
}

static bool subnet_ok(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(".:/,_-", *s)) return false;
    return true;
}

/* The command: a command of spmd runs this binary; anything else is a
 * program to run as given. */
static int add_command(char **cmd, int n, words *l)
{
    cli_command c = flags_command(cmd[0]);
    if (c && !(c & LAUNCHED_COMMANDS))
        return cli_fail("spmd %s does not run over processes: spmd launch runs train, explain or "
                        "sample, or a program", cmd[0]);
    if (c) {
#ifndef SPMD_HAVE_MPI
        return cli_fail("this spmd was built without MPI: its %s cannot run over processes "
                        "(rebuild with libopenmpi-dev installed)", cmd[0]);
#endif
        char self[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) return cli_fail("cannot find this spmd's path (/proc/self/exe): %s", strerror(errno));
        self[len] = '\0';
        int rc = add(l, "%s", self);
        if (rc) return rc;
    }
    for (int i = 0; i < n; i++)
        if (add(l, "%s", cmd[i])) return 2;
    return 0;
}

static int build_line(const cli_opts *o, const launch_hosts *h, bool prrte, char **cmd, int n,
                      words *l)
{
    char v[16];
    int rc = add(l, "%s", o->mpirun) || add_placement(o, h, prrte, l) || add(l, "--bind-to") ||
             add(l, "none");
    snprintf(v, sizeof v, "%d", KEEPALIVE_TIME_S);
    if (!rc) rc = add_oob(l, prrte, "oob_tcp_keepalive_time", v);
    snprintf(v, sizeof v, "%d", KEEPALIVE_INTVL_S);
    if (!rc) rc = add_oob(l, prrte, "oob_tcp_keepalive_intvl", v);
    snprintf(v, sizeof v, "%d", KEEPALIVE_PROBES);
    if (!rc) rc = add_oob(l, prrte, "oob_tcp_keepalive_probes", v);
    if (!rc && o->subnet) {
        if (!subnet_ok(o->subnet))
            return cli_fail("--subnet '%s': not a network (10.0.0.0/24) or interface names (eth0)",
                            o->subnet);
        rc = add(l, "--mca") || add(l, "btl_tcp_if_include") || add(l, "%s", o->subnet) ||
             add_oob(l, prrte, "oob_tcp_if_include", o->subnet);
    }
    for (int i = 0; !rc && i < o->n_env; i++) rc = add(l, "-x") || add(l, "%s", o->env[i]);
    for (int i = 0; !rc && i < o->n_mca; i++) {
        const char *eq = strchr(o->mca[i], '=');
        rc = add(l, "--mca") || add(l, "%.*s", (int)(eq - o->mca[i]), o->mca[i]) ||
             add(l, "%s", eq + 1);
    }
    return rc ? rc : add_command(cmd, n, l);
}

/* The first word of the command: after "--", or the first word that is
 * neither a flag nor a flag's value (every flag takes one). */
static int command_start(int argc, char **argv, int *flags_end)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            *flags_end = i;
            return i + 1;
        }
        if (argv[i][0] != '-') {
            *flags_end = i;
            return i;
        }
        if (!strchr(argv[i], '=') && strcmp(argv[i], "-h") && strcmp(argv[i], "--help")) i++;
    }
    *flags_end = argc;
    return argc;
}

int cmd_launch(int argc, char **argv)
{
    cli_opts o;
    int flags_end, first = command_start(argc, argv, &flags_end);
    /* flags_read, not flags_parse: the flags end at the command; its
     * paths checked as every command's. */
    int rc = flags_read(flags_end, argv, CMD_LAUNCH, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if ((rc = paths_check(&o))) return rc;
    if (first >= argc) {
        flags_usage(stderr, CMD_LAUNCH);
        return cli_fail("launch needs a command: spmd launch -n 2 -- train [flags], or a program "
                        "(spmd launch -n 2 -- python3 script.py)");
    }
    launch_hosts h;
    if ((rc = launch_hosts_read(o.hosts, &h))) return rc;
    int major = 0;
    words line = {0};
    rc = mpirun_release(o.mpirun, &major);
    if (!rc && build_line(&o, &h, major >= 5, argv + first, argc - first, &line)) rc = 2;
    launch_hosts_free(&h);
    if (!rc && o.dry_run) print_line(stdout, "", &line);
    else if (!rc) {
        print_line(stderr, "spmd launch: ", &line);
        rc = launch_watch_run(line.w, o.abort_wait_s);
    }
    words_free(&line);
    return rc;
}
