/*
 * Pieces of the JSON reports of `spmd train` and `spmd explain`: the
 * mesh, the collectives grouped per step, per-device and per-process
 * figures.
 */
#include "report.h"

#include "processes.h"

#include "mesh/mesh.h"

#include <cJSON.h>

#include <stdlib.h>
#include <string.h>

/* Collectives per step, grouped by kind, axes, bytes and phase. */
cJSON *report_collectives(const spmd_program *p)
{
    cJSON *list = cJSON_CreateArray();
    int n = spmd_program_collective_count(p);
    bool *done = calloc((size_t)(n ? n : 1), sizeof *done);
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        spmd_collective_info c, d;
        spmd_program_collective(p, i, &c);
        int count = 0, flying = 0, in_place = 0, written = 0;
        /* The values each one moves, so a script can tell a weight's
         * gather from an activation's. */
        cJSON *moves = cJSON_CreateArray();
        for (int j = i; j < n; j++) {
            spmd_program_collective(p, j, &d);
            if (!done[j] && !strcmp(c.kind, d.kind) && !strcmp(c.axes, d.axes) && c.bytes == d.bytes &&
                !strcmp(c.phase, d.phase)) {
                done[j] = true;
                count += d.count; /* once per micro-batch with accumulation */
                flying += d.in_flight_steps > 0;
                in_place += d.in_place && !d.written;
                written += d.written;
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
        cJSON_AddNumberToObject(o, "in_flight", flying);
        cJSON_AddNumberToObject(o, "read_in_place", in_place);
        cJSON_AddNumberToObject(o, "written_in_place", written);
        cJSON_AddItemToObject(o, "moves", moves);
        cJSON_AddItemToArray(list, o);
    }
    free(done);
    return list;
}

cJSON *report_mesh(const cli_model *m)
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

cJSON *report_processes(const spmd_program *p)
{
    int procs = processes_count(), first = 0;
    int here = spmd_program_local_devices(p, &first);
    /* A process runs at least one device: no more processes than the
     * largest mesh's devices, and no allocation that could fail before a
     * gather every process must join. */
    static double allocated[MESH_MAX_DEVICES];
    cJSON *list = cJSON_CreateArray();
    int rc = procs <= MESH_MAX_DEVICES
                 ? processes_gather_double((double)spmd_program_allocated_bytes(p), allocated)
                 : 1;
    for (int q = 0; !rc && q < procs; q++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", q);
        cJSON_AddNumberToObject(o, "first_device", q * here);
        cJSON_AddNumberToObject(o, "devices", here);
        cJSON_AddNumberToObject(o, "param_bytes", (double)here * (double)model_param_bytes(p));
        cJSON_AddNumberToObject(o, "allocated_bytes", allocated[q]);
        cJSON_AddItemToArray(list, o);
    }
    return list;
}

/* The same figure for every device: all run the same program. */
cJSON *report_per_device(const spmd_program *p, double value)
{
    cJSON *list = cJSON_CreateArray();
    for (int d = 0; d < spmd_program_devices(p); d++) cJSON_AddItemToArray(list, cJSON_CreateNumber(value));
    return list;
}
