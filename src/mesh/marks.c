/*
 * Sharding marks on graph tensors: the user's partition specs, parsed
 * against the graph's one mesh and kept in the graph's arena for
 * propagation to start from.  A failed mark leaves the earlier one (if
 * any) in place.
 */
#include "ir/ir.h"
#include "mesh/sharding.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

/* "'w'" or "#3 (matmul)" for messages. */
static const char *tensor_label(const spmd_tensor *t, char *buf, size_t size)
{
    if (t->name) snprintf(buf, size, "'%s'", t->name);
    else snprintf(buf, size, "#%d (%s)", t->id, ir_op_name(t->op));
    return buf;
}

/* Graphs hold one mesh: the first mark's, or an equal one. */
static spmd_status check_mesh(const spmd_graph *g, const spmd_mesh *m, const char *tensor)
{
    if (!g->mesh || mesh_equal(g->mesh, m)) return SPMD_OK;
    char have[256], got[256];
    return base_error(SPMD_ERR_INVALID,
                      "mark_sharding %s: the graph's marks use mesh %s, this one mesh %s; all "
                      "marks of a graph use one mesh",
                      tensor, mesh_describe(g->mesh, have, sizeof have),
                      mesh_describe(m, got, sizeof got));
}

spmd_status spmd_mark_sharding(spmd_graph *g, spmd_tensor *t, const spmd_mesh *m, const char *spec)
{
    if (!t) {
        /* A NULL from a failed builder: report that failure. */
        if (ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
        return base_error(SPMD_ERR_INVALID, "mark_sharding: tensor is NULL");
    }
    char label[96];
    tensor_label(t, label, sizeof label);
    if (!g || !m || !spec)
        return base_error(SPMD_ERR_INVALID, "mark_sharding %s: graph, mesh or spec is NULL", label);
    if (t->graph != g)
        return base_error(SPMD_ERR_INVALID, "mark_sharding %s: the tensor belongs to another graph",
                          label);
    spmd_status st = check_mesh(g, m, label);
    if (st) return st;
    sharding s;
    if ((st = sharding_parse(spec, m, t->rank, &s))) {
        char why[1024];
        snprintf(why, sizeof why, "%s", spmd_last_error());
        return base_error(st, "mark_sharding %s: %s", label, why);
    }
    for (int i = 0; i < s.rank; i++)
        for (int k = 0; k < s.dim[i].n; k++)
            if (m->independent[s.dim[i].axis[k]])
                return base_error(SPMD_ERR_INVALID,
                                  "mark_sharding %s: spec \"%s\" splits dim %d over axis '%s', which "
                                  "is independent (each group along it trains a model of its own; "
                                  "nothing is split over it)",
                                  label, spec, i, m->names[s.dim[i].axis[k]]);
    for (int i = 0; i < s.rank; i++)
        for (int k = 0; k < s.dim[i].n; k++)
            if (m->stage[s.dim[i].axis[k]])
                return base_error(SPMD_ERR_INVALID,
                                  "mark_sharding %s: spec \"%s\" splits dim %d over axis '%s', which "
                                  "is the stage axis (each of its members runs its own layers; "
                                  "nothing is split over it)",
                                  label, spec, i, m->names[s.dim[i].axis[k]]);
    for (int i = 0; i < s.rank; i++) {
        int64_t groups = mesh_axes_groups(&s.dim[i]), blocks = sharding_blocks(&s, m, i);
        if (s.dim[i].n && !sharding_groups_exact(&s, m, i, t->dims[i]))
            return base_error(SPMD_ERR_SHAPE,
                              "mark_sharding %s: spec \"%s\" cuts dim %d (%lld) into %lld groups "
                              "of %lld blocks: a grouped split must divide the dim exactly",
                              label, spec, i, (long long)t->dims[i], (long long)groups,
                              (long long)blocks);
    }
    if (s.partial) {
        char quoted[MESH_EXCERPT_SIZE];
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "mark_sharding %s: spec \"%s\": a mark lays a value out; partial(...) "
                          "only describes pending sums the partitioner makes", label,
                          mesh_text_excerpt(spec, strcspn(spec, "|"), quoted, sizeof quoted));
    }
    /* A new one each time: autodiff shares a value's mark with its adjoint. */
    sharding *mark = base_arena_alloc(&g->arena, sizeof *mark);
    if (!mark) return SPMD_ERR_NOMEM;
    *mark = s;
    t->mark = mark;
    if (!g->mesh) g->mesh = m;
    return SPMD_OK;
}

/* Clears the user's mark only: a propagated sharding belongs to the
 * partitioner.  The graph forgets its mesh with its last sharding. */
spmd_status spmd_clear_sharding(spmd_tensor *t)
{
    if (!t) return base_error(SPMD_ERR_INVALID, "clear_sharding: tensor is NULL");
    spmd_graph *g = t->graph;
    t->mark = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->mark || g->nodes[i]->sharding) return SPMD_OK;
    g->mesh = NULL;
    return SPMD_OK;
}

/* The propagated sharding, else the mark; NULL without a mesh. */
static const sharding *current(const spmd_tensor *t)
{
    if (!t->graph->mesh) return NULL;
    return t->sharding ? t->sharding : t->mark;
}

typedef const char *(*format_fn)(const sharding *, const spmd_mesh *, char *, size_t);

static const char *get_text(const spmd_tensor *t, char *buf, size_t size, format_fn format)
{
    if (!buf || size == 0) return "";
    buf[0] = '\0';
    const sharding *s = t ? current(t) : NULL;
    return s ? format(s, t->graph->mesh, buf, size) : buf;
}

const char *spmd_get_sharding(const spmd_tensor *t, char *buf, size_t size)
{
    return get_text(t, buf, size, sharding_format);
}

const char *spmd_get_hlo_sharding(const spmd_tensor *t, char *buf, size_t size)
{
    return get_text(t, buf, size, sharding_format_hlo);
}

int spmd_sharding_visualize(const spmd_mesh *m, const char *spec, int rank, const int64_t *dims,
                            char *buf, size_t size)
{
    if (!m || !spec || !buf || (rank > 0 && !dims)) {
        base_error(SPMD_ERR_INVALID, "visualize: mesh, spec, dims or buffer is NULL");
        return -1;
    }
    sharding s;
    if (sharding_parse(spec, m, rank, &s) != SPMD_OK) return -1;
    return sharding_visualize(&s, m, rank, dims, buf, size);
}
