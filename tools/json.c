/*
 * Report pieces shared by `spmd train` and `spmd explain`: the mesh, the
 * collectives grouped per step, per-device figures, writing JSON files.
 */
#include "cli.h"
#include "processes.h"

#include "mesh/mesh.h"

#include <cJSON.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Collectives per step, grouped by kind, axes, bytes and phase. */
cJSON *cli_collectives_json(const spmd_program *p)
{
    cJSON *list = cJSON_CreateArray();
    int n = spmd_program_collective_count(p);
    bool *done = calloc((size_t)(n ? n : 1), sizeof *done);
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        spmd_collective_info c, d;
        spmd_program_collective(p, i, &c);
        int count = 0;
        /* The values each one moves, so a script can tell a weight's
         * gather from an activation's. */
        cJSON *moves = cJSON_CreateArray();
        for (int j = i; j < n; j++) {
            spmd_program_collective(p, j, &d);
            if (!done[j] && !strcmp(c.kind, d.kind) && !strcmp(c.axes, d.axes) && c.bytes == d.bytes &&
                !strcmp(c.phase, d.phase)) {
                done[j] = true;
                count++;
                cJSON_AddItemToArray(moves, cJSON_CreateString(d.tensor));
            }
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kind", c.kind);
        cJSON *axes = cJSON_AddArrayToObject(o, "axes");
        char names[sizeof c.axes];
        strcpy(names, c.axes);
        for (char *tok = strtok(names, ","); tok; tok = strtok(NULL, ","))
            cJSON_AddItemToArray(axes, cJSON_CreateString(tok));
        cJSON_AddNumberToObject(o, "bytes", (double)c.bytes);
        cJSON_AddNumberToObject(o, "count", count);
        cJSON_AddStringToObject(o, "phase", c.phase);
        cJSON_AddNumberToObject(o, "seconds", c.seconds * count);
        cJSON_AddItemToObject(o, "moves", moves);
        cJSON_AddItemToArray(list, o);
    }
    free(done);
    return list;
}

cJSON *cli_mesh_json(const cli_model *m)
{
    cJSON *mesh = cJSON_CreateObject();
    cJSON *shape = cJSON_AddArrayToObject(mesh, "shape"), *axes = cJSON_AddArrayToObject(mesh, "axes");
    if (!m->mesh) {
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(1));
        cJSON_AddItemToArray(axes, cJSON_CreateString("data"));
        return mesh;
    }
    for (int i = 0; i < spmd_mesh_rank(m->mesh); i++) {
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(spmd_mesh_axis_size(m->mesh, i)));
        cJSON_AddItemToArray(axes, cJSON_CreateString(spmd_mesh_axis_name(m->mesh, i)));
    }
    /* Over several processes: which axes keep their groups inside one. */
    if (spmd_mesh_processes(m->mesh) > 1) {
        cJSON_AddNumberToObject(mesh, "processes", spmd_mesh_processes(m->mesh));
        cJSON *local = cJSON_AddArrayToObject(mesh, "local");
        for (int i = 0; i < spmd_mesh_rank(m->mesh); i++)
            cJSON_AddItemToArray(local, cJSON_CreateBool(spmd_mesh_axis_is_local(m->mesh, i)));
        double latency, bandwidth;
        spmd_mesh_network(m->mesh, &latency, &bandwidth);
        cJSON *net = cJSON_AddObjectToObject(mesh, "network");
        cJSON_AddNumberToObject(net, "latency_s", latency);
        cJSON_AddNumberToObject(net, "bytes_per_s", bandwidth);
        cJSON_AddStringToObject(net, "source", m->network_source ? m->network_source : "assumed");
    }
    return mesh;
}

cJSON *cli_processes_json(const spmd_program *p)
{
    int procs = cli_processes(), first = 0;
    int here = spmd_program_local_devices(p, &first);
    /* A process runs at least one device: no more processes than the
     * largest mesh's devices, and no allocation that could fail before a
     * gather every process must join. */
    static double allocated[MESH_MAX_DEVICES];
    cJSON *list = cJSON_CreateArray();
    int rc = procs <= MESH_MAX_DEVICES
                 ? cli_gather_double((double)spmd_program_allocated_bytes(p), allocated)
                 : 1;
    for (int q = 0; !rc && q < procs; q++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", q);
        cJSON_AddNumberToObject(o, "first_device", q * here);
        cJSON_AddNumberToObject(o, "devices", here);
        cJSON_AddNumberToObject(o, "param_bytes", (double)here * (double)cli_param_bytes(p));
        cJSON_AddNumberToObject(o, "allocated_bytes", allocated[q]);
        cJSON_AddItemToArray(list, o);
    }
    return list;
}

/* The same figure for every device: all run the same program. */
cJSON *cli_per_device(const spmd_program *p, double value)
{
    cJSON *list = cJSON_CreateArray();
    for (int d = 0; d < spmd_program_devices(p); d++) cJSON_AddItemToArray(list, cJSON_CreateNumber(value));
    return list;
}

/* Where a report goes: a symbolic link's target (replacing the link would
 * leave the target stale), else the path as given.  Only a regular file
 * may be replaced: renaming over a device or a directory is never meant.
 * 0, or errno with `why` set. */
static int report_target(const char *path, char *target, size_t size, const char **why)
{
    struct stat st;
    char resolved[PATH_MAX];
    *why = NULL;
    if (stat(path, &st) != 0) {
        snprintf(target, size, "%s", path);
        return 0;
    }
    if (S_ISDIR(st.st_mode)) *why = "is a directory";
    else if (!S_ISREG(st.st_mode)) *why = "is not a regular file";
    if (*why) return EINVAL;
    snprintf(target, size, "%s", realpath(path, resolved) ? resolved : path);
    return 0;
}

/* A new temporary file beside `target` (same directory, so rename() can
 * replace the target in one step); its name goes to `tmp`.  -1 with errno. */
static int temp_beside(const char *target, char *tmp, size_t size)
{
    const char *slash = strrchr(target, '/');
    int dir = slash ? (int)(slash - target) + 1 : 0;
    if ((size_t)snprintf(tmp, size, "%.*s.%s.XXXXXX", dir, target, target + dir) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkstemp(tmp);
}

int cli_check_report_path(const char *path)
{
    char target[PATH_MAX], tmp[PATH_MAX + 16];
    const char *why;
    if (report_target(path, target, sizeof target, &why)) return cli_fail("--json %s %s", path, why);
    int fd = temp_beside(target, tmp, sizeof tmp);
    if (fd < 0) return cli_fail("--json %s: cannot create a file there: %s", path, strerror(errno));
    close(fd);
    unlink(tmp);
    return 0;
}

static int write_all(int fd, const char *text, size_t n)
{
    while (n) {
        ssize_t w = write(fd, text, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        text += w, n -= (size_t)w;
    }
    return 0;
}

/* The mode a new report gets: the old one's, else what the umask allows. */
static mode_t report_mode(const char *target)
{
    struct stat st;
    if (stat(target, &st) == 0) return st.st_mode & 07777;
    mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

int cli_write_json(const char *path, cJSON *root)
{
    /* Over several processes, process 0 writes the run's one report. */
    if (cli_process_rank() != 0) {
        cJSON_Delete(root);
        return 0;
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return cli_fail("could not format the JSON report");
    /* Written whole beside the target, then renamed over it: a failure
     * at any point leaves the earlier report, never a truncated one. */
    char target[PATH_MAX], tmp[PATH_MAX + 16];
    const char *why;
    int err = report_target(path, target, sizeof target, &why), fd = -1;
    if (!err && (fd = temp_beside(target, tmp, sizeof tmp)) < 0) err = errno;
    if (!err) err = write_all(fd, text, strlen(text));
    if (!err) err = write_all(fd, "\n", 1);
    if (!err && (fchmod(fd, report_mode(target)) != 0 || fsync(fd) != 0)) err = errno;
    if (fd >= 0 && close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, target) != 0) err = errno;
    if (err && fd >= 0) unlink(tmp);
    free(text);
    if (!err) return 0;
    cli_fail("cannot write the report %s: %s; an earlier report there is left as it was", path,
             why ? why : strerror(err));
    return 1;
}

void cli_mesh_text(const cli_model *m, char *buf, size_t size)
{
    if (!m->mesh) {
        snprintf(buf, size, "1 device");
        return;
    }
    size_t n = 0;
    for (int i = 0; i < spmd_mesh_rank(m->mesh); i++)
        n += (size_t)snprintf(buf + n, size - n, i ? "x%d" : "%d", spmd_mesh_axis_size(m->mesh, i));
    n += (size_t)snprintf(buf + n, size - n, " (");
    for (int i = 0; i < spmd_mesh_rank(m->mesh); i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %s" : "%s", spmd_mesh_axis_name(m->mesh, i));
    snprintf(buf + n, size - n, ")");
}

