/*
 * The hosts of a launch (launch_hosts.h).  A list is passed to mpirun as
 * --host NAME:SLOTS,..., so the line `spmd launch` prints shows every
 * host; a hostfile is Open MPI's to read.
 */
#include "launch_hosts.h"

#include "message.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_NAME = 255 };

/* A host name as a list or Slurm spells it: letters, digits, '.', '-', '_'. */
static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > MAX_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr(".-_", s[i])) return false;
    return true;
}

static int add_host(launch_hosts *h, const char *name, size_t len, int slots)
{
    if (h->n == LAUNCH_MAX_HOSTS)
        return cli_fail("%s names more than %d hosts", h->source, LAUNCH_MAX_HOSTS);
    if (h->n % 64 == 0) {
        launch_host *grown = realloc(h->host, (size_t)(h->n + 64) * sizeof *grown);
        if (!grown) return cli_fail("out of memory");
        h->host = grown;
    }
    char *copy = malloc(len + 1);
    if (!copy) return cli_fail("out of memory");
    memcpy(copy, name, len);
    copy[len] = '\0';
    h->host[h->n++] = (launch_host){copy, slots};
    return 0;
}

/* A positive count of slots or tasks, the whole of [s, s + n). */
static bool count_ok(const char *s, size_t n, int *out)
{
    if (n == 0 || n > 7) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = (int)v;
    return v > 0;
}

/* ---- --hosts LIST ------------------------------------------------------------------------ */

/* "a:4,b:4" (slots 1 where not given). */
static int read_list(const char *list, launch_hosts *h)
{
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        size_t name_len = colon ? (size_t)(colon - p) : len;
        int slots = 1;
        if (!name_ok(p, name_len) ||
            (colon && !count_ok(colon + 1, len - name_len - 1, &slots)))
            return cli_fail("--hosts %s: '%.*s' is not HOST or HOST:SLOTS (a host name and its "
                            "process count, as node1:4), and no file has that name",
                            list, (int)len, p);
        int rc = add_host(h, p, name_len, slots);
        if (rc) return rc;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* ---- Slurm's allocation ------------------------------------------------------------------ */

/* The end of the item starting at s in a Slurm host list: the first ','
 * outside brackets, or the end. */
static const char *item_end(const char *s)
{
    int depth = 0;
    for (; *s; s++) {
        if (*s == '[') depth++;
        else if (*s == ']') depth--;
        else if (*s == ',' && depth == 0) break;
    }
    return s;
}

/* Every name of one item of a compressed Slurm host list, as
 * "rack[1-2]-node[01-03,7]" (each bracket a comma-separated set of
 * numbers and ranges, zero-padded to the width of a range's start), into
 * h.  `item` is NUL-terminated; it is expanded one bracket at a time. */
static int expand_item(const char *item, launch_hosts *h, const char *list)
{
    const char *open = strchr(item, '[');
    if (!open) {
        if (!name_ok(item, strlen(item)))
            return cli_fail("SLURM_JOB_NODELIST=%s: '%s' is not a host name", list, item);
        return add_host(h, item, strlen(item), 1);
    }
    const char *close = strchr(open, ']');
    if (!close || close == open + 1)
        return cli_fail("SLURM_JOB_NODELIST=%s: an unclosed or empty '[' in '%s'", list, item);
    size_t prefix = (size_t)(open - item);
    for (const char *r = open + 1; r < close;) {
        size_t len = strcspn(r, ",]");
        const char *dash = memchr(r, '-', len);
        size_t a_len = dash ? (size_t)(dash - r) : len;
        int a = 0, b = 0;
        /* count_ok refuses 0, which a range may start at: check digits apart. */
        bool ok = a_len > 0 && a_len <= 7 && strspn(r, "0123456789") >= a_len;
        if (ok) a = atoi(r), b = a;
        if (ok && dash) {
            size_t b_len = len - a_len - 1;
            ok = b_len > 0 && b_len <= 7 && strspn(dash + 1, "0123456789") >= b_len;
            if (ok) b = atoi(dash + 1);
            ok = ok && b >= a;
        }
        if (!ok)
            return cli_fail("SLURM_JOB_NODELIST=%s: '%.*s' in '%s' is not a number or a range "
                            "A-B", list, (int)len, r, item);
        if ((long)(b - a) + 1 > LAUNCH_MAX_HOSTS - h->n)
            return cli_fail("SLURM_JOB_NODELIST=%s names more than %d hosts", list,
                            LAUNCH_MAX_HOSTS);
        for (int v = a; v <= b; v++) {
            char next[2 * MAX_NAME + 64];
            int n = snprintf(next, sizeof next, "%.*s%0*d%s", (int)prefix, item, (int)a_len, v,
                             close + 1);
            if (n < 0 || (size_t)n >= sizeof next)
                return cli_fail("SLURM_JOB_NODELIST=%s: a host name longer than %d", list, MAX_NAME);
            int rc = expand_item(next, h, list);
            if (rc) return rc;
        }
        r += len + (r[len] == ',');
    }
    return 0;
}

static int expand_nodelist(const char *list, launch_hosts *h)
{
    for (const char *p = list; *p;) {
        const char *end = item_end(p);
        char item[2 * MAX_NAME + 64];
        if ((size_t)(end - p) >= sizeof item)
            return cli_fail("SLURM_JOB_NODELIST=%s: an item longer than %d", list, MAX_NAME);
        snprintf(item, sizeof item, "%.*s", (int)(end - p), p);
        int rc = expand_item(item, h, list);
        if (rc) return rc;
        p = *end ? end + 1 : end;
    }
    if (h->n == 0) return cli_fail("SLURM_JOB_NODELIST is empty");
    return 0;
}

/* SLURM_TASKS_PER_NODE, "2(x3),1": each host's tasks, in the list's order. */
static int tasks_per_node(const char *counts, launch_hosts *h)
{
    int i = 0;
    for (const char *p = counts; *p;) {
        size_t len = strcspn(p, ",");
        size_t num = strcspn(p, "(,");
        int tasks = 0, times = 1;
        bool ok = count_ok(p, num, &tasks);
        if (ok && num < len) /* "(xN)" */
            ok = len - num > 3 && p[num + 1] == 'x' && p[len - 1] == ')' &&
                 count_ok(p + num + 2, len - num - 3, &times);
        if (!ok)
            return cli_fail("SLURM_TASKS_PER_NODE=%s: '%.*s' is not N or N(xM)", counts, (int)len, p);
        for (int t = 0; t < times; t++, i++)
            if (i < h->n) h->host[i].slots = tasks;
        p += len + (p[len] == ',');
    }
    if (i != h->n)
        return cli_fail("SLURM_TASKS_PER_NODE=%s counts %d hosts, SLURM_JOB_NODELIST names %d",
                        counts, i, h->n);
    return 0;
}

static int read_slurm(const char *nodelist, launch_hosts *h)
{
    snprintf(h->source, sizeof h->source, "Slurm's allocation (SLURM_JOB_NODELIST=%.60s%s)",
             nodelist, strlen(nodelist) > 60 ? "..." : "");
    int rc = expand_nodelist(nodelist, h);
    const char *ntasks = getenv("SLURM_NTASKS"), *per_node = getenv("SLURM_TASKS_PER_NODE");
    if (!rc && ntasks && *ntasks && !count_ok(ntasks, strlen(ntasks), &h->tasks))
        rc = cli_fail("SLURM_NTASKS=%s is not a positive count", ntasks);
    if (!rc && per_node && *per_node) rc = tasks_per_node(per_node, h);
    else if (!rc && h->tasks) /* the tasks spread evenly, the first hosts one more */
        for (int i = 0; i < h->n; i++) {
            int slots = h->tasks / h->n + (i < h->tasks % h->n);
            h->host[i].slots = slots > 0 ? slots : 1;
        }
    return rc;
}

/* ---- Both --------------------------------------------------------------------------------- */

int launch_hosts_read(const char *flag, launch_hosts *h)
{
    *h = (launch_hosts){0};
    int rc = 0;
    if (flag) {
        snprintf(h->source, sizeof h->source, "--hosts %.80s%s", flag, strlen(flag) > 80 ? "..." : "");
        struct stat st;
        if (stat(flag, &st) == 0) {
            if (!S_ISREG(st.st_mode))
                return cli_fail("--hosts %s: not a regular file (a hostfile, or a list "
                                "HOST:SLOTS,...)", flag);
            h->file = flag;
            return 0;
        }
        if (strchr(flag, '/'))
            return cli_fail("--hosts %s: %s (a hostfile, or a list HOST:SLOTS,...)", flag,
                            strerror(errno));
        rc = read_list(flag, h);
    } else {
        const char *nodelist = getenv("SLURM_JOB_NODELIST");
        if (!nodelist || !*nodelist) nodelist = getenv("SLURM_NODELIST");
        if (nodelist && *nodelist) rc = read_slurm(nodelist, h);
    }
    if (rc) launch_hosts_free(h);
    return rc;
}

void launch_hosts_free(launch_hosts *h)
{
    for (int i = 0; i < h->n; i++) free(h->host[i].name);
    free(h->host);
    h->host = NULL;
    h->n = 0;
}

long launch_hosts_slots(const launch_hosts *h)
{
    long n = 0;
    for (int i = 0; i < h->n; i++) n += h->host[i].slots;
    return n;
}
