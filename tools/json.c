/*
 * Report pieces shared by `spmd train` and `spmd explain`: the mesh, the
 * collectives grouped per step, per-device figures, writing JSON files.
 */
#include "cli.h"

#include <cJSON.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
        for (int j = i; j < n; j++) {
            spmd_program_collective(p, j, &d);
            if (!done[j] && !strcmp(c.kind, d.kind) && !strcmp(c.axes, d.axes) && c.bytes == d.bytes &&
                !strcmp(c.phase, d.phase)) {
                done[j] = true;
                count++;
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
    return mesh;
}

/* The same figure for every device: all run the same program. */
cJSON *cli_per_device(const spmd_program *p, double value)
{
    cJSON *list = cJSON_CreateArray();
    for (int d = 0; d < spmd_program_devices(p); d++) cJSON_AddItemToArray(list, cJSON_CreateNumber(value));
    return list;
}

int cli_write_json(const char *path, cJSON *root)
{
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return cli_fail("could not format the JSON report");
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0) rc = cli_fail("cannot write %s: %s", path, strerror(errno));
    if (f && fclose(f) != 0 && !rc) rc = cli_fail("cannot write %s: %s", path, strerror(errno));
    free(text);
    return rc;
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

