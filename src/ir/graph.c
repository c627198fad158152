/*
 * The graph: node creation, leaves, names, outputs and updates, queries,
 * and the failures of builder calls that a graph keeps.  Op builders with
 * their shape checks live in builders.c.
 */
#include "ir/ir.h"
#include "ir/op_columns.h"
#include "base/error.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- Graph lifetime ------------------------------------------------------ */

spmd_graph *spmd_graph_create(const spmd_allocator *alloc)
{
    spmd_graph *g = base_calloc(alloc, sizeof *g, "graph");
    if (!g) return NULL;
    g->alloc = base_allocator_or_default(alloc);
    base_arena_init(&g->arena, &g->alloc);
    g->stage = -1;
    g->micro = -1;
    return g;
}

void spmd_graph_free(spmd_graph *g)
{
    if (!g) return;
    spmd_allocator a = g->alloc;
    base_arena_free(&g->arena);
    base_free(&a, g->nodes);
    base_free(&a, g->names);
    base_free(&a, g->updates);
    base_free(&a, g);
}

/* Grow a pointer array owned by the graph's allocator. */
static bool grow(spmd_graph *g, void **items, int *cap, int need, size_t item_size)
{
    return base_grow(&g->alloc, items, cap, need, item_size, 64, "graph node list");
}

/* ---- Shapes ---------------------------------------------------------------- */

int64_t ir_numel(const spmd_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

size_t ir_nbytes(const spmd_tensor *t) { return (size_t)ir_numel(t) * spmd_dtype_size(t->dtype); }

bool ir_same_shape(const spmd_tensor *a, const spmd_tensor *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

const char *ir_shape_str(const spmd_tensor *t, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

const char *ir_label(const spmd_tensor *t, char *buf, size_t size)
{
    char shape[96];
    ir_shape_str(t, shape, sizeof shape);
    if (t->name)
        snprintf(buf, size, "'%s' %s", t->name, shape);
    else
        snprintf(buf, size, "%s #%d %s", ir_op_name(t->op), t->id, shape);
    return buf;
}

void ir_mark_inputs(const spmd_graph *g, bool *marked, int last)
{
    for (int i = last; i >= 0; i--) {
        if (!marked[i]) continue;
        const spmd_tensor *t = g->nodes[i];
        for (int j = 0; j < t->n_in; j++) marked[t->in[j]->id] = true;
    }
}

size_t spmd_dtype_size(spmd_dtype dtype)
{
    switch (dtype) {
    case SPMD_F32: return 4;
    case SPMD_I32: return 4;
    case SPMD_BF16: return 2;
    }
    return 0;
}

const char *spmd_dtype_name(spmd_dtype dtype)
{
    switch (dtype) {
    case SPMD_F32: return "f32";
    case SPMD_I32: return "i32";
    case SPMD_BF16: return "bf16";
    }
    return "?";
}

/* ---- Failures ---------------------------------------------------------------- */

/* The failure just recorded on this thread becomes g's, if g has none. */
static void keep_first(spmd_graph *g)
{
    if (!g || g->failure.status != SPMD_OK) return;
    g->failure.status = base_error_status();
    snprintf(g->failure.message, sizeof g->failure.message, "%s", spmd_last_error());
}

spmd_status ir_error(spmd_graph *g, spmd_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    base_verror(status, fmt, ap);
    va_end(ap);
    keep_first(g);
    return status;
}

spmd_status ir_error_keep(spmd_graph *g)
{
    /* A callee that failed without recording why is a bug: record that. */
    if (base_error_status() == SPMD_OK) BASE_INTERNAL("a call failed without recording why");
    keep_first(g);
    return base_error_status();
}

spmd_tensor *ir_null_operand(spmd_graph *g, const char *op, int i)
{
    if (ir_error_raise(g) == SPMD_OK)
        ir_error(g, SPMD_ERR_INVALID, "%s: operand %d is NULL", op, i);
    return NULL;
}

spmd_status ir_error_raise(const spmd_graph *g)
{
    if (!g || g->failure.status == SPMD_OK) return SPMD_OK;
    return base_error(g->failure.status, "%s", g->failure.message);
}

spmd_status ir_graph_status(const spmd_graph *g) { return g ? g->failure.status : SPMD_OK; }

void ir_error_scope_begin(spmd_graph *g, ir_failure *outer)
{
    *outer = g->failure;
    g->failure.status = SPMD_OK;
    g->failure.message[0] = '\0';
}

void ir_error_scope_end(spmd_graph *g, const ir_failure *outer)
{
    if (outer->status != SPMD_OK) g->failure = *outer;
}

spmd_status spmd_graph_status(const spmd_graph *g)
{
    if (!g) return base_error(SPMD_ERR_INVALID, "graph_status: graph is NULL");
    return ir_error_raise(g);
}

/* ---- Nodes ------------------------------------------------------------------ */

spmd_tensor *ir_node_new(spmd_graph *g, ir_op op, spmd_dtype dtype, int rank,
                         const int64_t *dims, spmd_tensor *const *in, int n_in)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "%s: graph is NULL", ir_op_name(op));
        return NULL;
    }
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) return ir_null_operand(g, ir_op_name(op), i);
        if (in[i]->graph != g) {
            ir_error(g, SPMD_ERR_INVALID, "%s: operand %d belongs to another graph",
                     ir_op_name(op), i);
            return NULL;
        }
    }
    if (rank < 0 || rank > SPMD_MAX_RANK) {
        ir_error(g, SPMD_ERR_SHAPE, "%s: rank %d outside 0..%d", ir_op_name(op), rank,
                 SPMD_MAX_RANK);
        return NULL;
    }
    if (n_in > IR_MAX_INPUTS) {
        ir_error(g, SPMD_ERR_INVALID, "%s: %d operands, at most %d", ir_op_name(op), n_in,
                 IR_MAX_INPUTS);
        return NULL;
    }
    for (int i = 0; i < rank; i++) {
        if (dims[i] <= 0) {
            ir_error(g, SPMD_ERR_SHAPE, "%s: dimension %d is %lld; sizes must be positive",
                     ir_op_name(op), i, (long long)dims[i]);
            return NULL;
        }
    }
    if (!grow(g, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) {
        ir_error_keep(g);
        return NULL;
    }
    spmd_tensor *t = base_arena_alloc(&g->arena, sizeof *t + (size_t)n_in * sizeof t->in[0]);
    if (!t) {
        ir_error_keep(g);
        return NULL;
    }
    t->id = g->n_nodes;
    t->op = op;
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->n_in = n_in;
    for (int i = 0; i < n_in; i++) t->in[i] = in[i];
    t->stage = (int16_t)g->stage;
    t->micro = (int16_t)(ir_op_is_leaf(op) ? -1 : g->micro); /* a leaf serves every micro-batch */
    t->graph = g;
    g->nodes[g->n_nodes++] = t;
    return t;
}

/* ---- Names ------------------------------------------------------------------- */

static _Thread_local uint64_t name_compares;

uint64_t ir_name_compares(void) { return name_compares; }

/* FNV-1a. */
static uint64_t name_hash(const char *name)
{
    uint64_t h = 14695981039346656037u;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 1099511628211u;
    return h;
}

static void index_put(spmd_graph *g, spmd_tensor *t)
{
    size_t mask = (size_t)g->cap_names - 1, i = (size_t)name_hash(t->name) & mask;
    while (g->names[i]) i = (i + 1) & mask;
    g->names[i] = t;
    g->n_names++;
}

/* Room in the index for one more name, so that naming a tensor after this
 * cannot fail.  A full index is rebuilt at twice the size from the nodes,
 * which also drops the old slots of renamed tensors. */
static bool index_make_room(spmd_graph *g)
{
    if (2 * (g->n_names + 1) <= g->cap_names) return true;
    if (g->cap_names > INT_MAX / 4) {
        base_error(SPMD_ERR_NOMEM, "graph: too many named tensors to index");
        return false;
    }
    int cap = g->cap_names ? 2 * g->cap_names : 64;
    spmd_tensor **slots = base_calloc(&g->alloc, (size_t)cap * sizeof *slots, "graph name index");
    if (!slots) return false;
    base_free(&g->alloc, g->names);
    g->names = slots;
    g->cap_names = cap;
    g->n_names = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->name) index_put(g, g->nodes[i]);
    return true;
}

/* `name` is free in g, and the index has room for it. */
static bool name_ok(spmd_graph *g, const char *name, const char *what)
{
    if (!name || !*name) {
        base_error(SPMD_ERR_INVALID, "%s: a name is required", what);
        return false;
    }
    if (!index_make_room(g)) return false;
    if (spmd_graph_find(g, name)) {
        base_error(SPMD_ERR_INVALID, "%s: the graph already has a tensor named '%s'", what,
                   name);
        return false;
    }
    return true;
}

static spmd_tensor *leaf(spmd_graph *g, ir_op op, const char *name, spmd_dtype dtype,
                         int rank, const int64_t *dims, spmd_init init)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "%s: graph is NULL", ir_op_name(op));
        return NULL;
    }
    if (!name_ok(g, name, ir_op_name(op))) {
        ir_error_keep(g);
        return NULL;
    }
    if (rank > 0 && !dims) {
        ir_error(g, SPMD_ERR_INVALID, "%s '%s': dims is NULL", ir_op_name(op), name);
        return NULL;
    }
    if (dtype != SPMD_F32 && dtype != SPMD_I32) {
        ir_error(g, SPMD_ERR_UNSUPPORTED,
                 "%s '%s': dtype %s; inputs, parameters and state are f32 or i32 (spmd_convert "
                 "makes bf16 copies, spmd_graph_set_matmul_precision the matmuls' own)",
                 ir_op_name(op), name, spmd_dtype_name(dtype));
        return NULL;
    }
    if ((unsigned)init.kind > SPMD_INIT_CONSTANT) {
        ir_error(g, SPMD_ERR_INVALID, "%s '%s': unknown init kind %d", ir_op_name(op), name,
                 (int)init.kind);
        return NULL;
    }
    spmd_tensor *t = ir_node_new(g, op, dtype, rank, dims, NULL, 0);
    if (!t) return NULL;
    t->name = base_arena_strdup(&g->arena, name);
    if (!t->name) {
        ir_error_keep(g);
        return NULL;
    }
    index_put(g, t);
    t->init = init;
    return t;
}

spmd_tensor *spmd_input(spmd_graph *g, const char *name, spmd_dtype dtype, int rank,
                        const int64_t *dims)
{
    return leaf(g, IR_INPUT, name, dtype, rank, dims, (spmd_init){SPMD_INIT_ZEROS, 0});
}

spmd_tensor *spmd_param(spmd_graph *g, const char *name, int rank, const int64_t *dims,
                        spmd_init init)
{
    return leaf(g, IR_PARAM, name, SPMD_F32, rank, dims, init);
}

spmd_tensor *spmd_state(spmd_graph *g, const char *name, int rank, const int64_t *dims,
                        spmd_init init)
{
    return leaf(g, IR_STATE, name, SPMD_F32, rank, dims, init);
}

spmd_tensor *spmd_fill(spmd_graph *g, int rank, const int64_t *dims, float value)
{
    if (rank > 0 && !dims) {
        ir_error(g, SPMD_ERR_INVALID, "fill: dims is NULL");
        return NULL;
    }
    spmd_tensor *t = ir_node_new(g, IR_FILL, SPMD_F32, rank, dims, NULL, 0);
    if (t) t->attr.fill.value = value;
    return t;
}

/* ---- Outputs and updates -------------------------------------------------- */

spmd_status spmd_graph_mark_output(spmd_graph *g, spmd_tensor *t)
{
    /* A NULL from a failed builder reports that failure, not a NULL. */
    if (g && !t && ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
    if (!g || !t) return base_error(SPMD_ERR_INVALID, "mark_output: graph or tensor is NULL");
    if (t->graph != g) return base_error(SPMD_ERR_INVALID, "mark_output: tensor of another graph");
    t->is_output = true;
    return SPMD_OK;
}

spmd_status spmd_graph_set_update(spmd_graph *g, spmd_tensor *target, spmd_tensor *value)
{
    if (g && (!target || !value) && ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
    if (!g || !target || !value)
        return base_error(SPMD_ERR_INVALID, "set_update: graph, target or value is NULL");
    if (target->graph != g || value->graph != g)
        return base_error(SPMD_ERR_INVALID, "set_update: tensors of another graph");
    if (!ir_is_persistent(target))
        return base_error(SPMD_ERR_INVALID,
                          "set_update: target must be a param or state, '%s' is a %s",
                          target->name ? target->name : "(unnamed)", ir_op_name(target->op));
    if (!ir_same_shape(target, value) || target->dtype != value->dtype) {
        char a[96], b[96];
        return base_error(SPMD_ERR_SHAPE, "set_update: target '%s' %s and value %s %s differ",
                          target->name, ir_shape_str(target, a, sizeof a), ir_op_name(value->op),
                          ir_shape_str(value, b, sizeof b));
    }
    /* A flag, not a scan of the updates: an optimizer sets one per
     * parameter and state, and a scan made that quadratic. */
    if (target->has_update)
        return base_error(SPMD_ERR_INVALID, "set_update: '%s' already has an update",
                          target->name);
    if (!grow(g, (void **)&g->updates, &g->cap_updates, g->n_updates + 1, sizeof *g->updates))
        return SPMD_ERR_NOMEM;
    g->updates[g->n_updates++] = (ir_update){target, value};
    target->has_update = true;
    return SPMD_OK;
}

/* ---- Queries ---------------------------------------------------------------- */

int spmd_tensor_rank(const spmd_tensor *t) { return t ? t->rank : -1; }

int64_t spmd_tensor_dim(const spmd_tensor *t, int i)
{
    if (!t || i < 0 || i >= t->rank) return -1;
    return t->dims[i];
}

int64_t spmd_tensor_numel(const spmd_tensor *t) { return t ? ir_numel(t) : -1; }
spmd_dtype spmd_tensor_dtype(const spmd_tensor *t) { return t ? t->dtype : SPMD_F32; }
const char *spmd_tensor_name(const spmd_tensor *t) { return t ? t->name : NULL; }
const char *spmd_tensor_op_name(const spmd_tensor *t) { return t ? ir_op_name(t->op) : "?"; }
bool spmd_tensor_is_param(const spmd_tensor *t) { return t && t->op == IR_PARAM; }
bool spmd_tensor_is_frozen(const spmd_tensor *t) { return t && t->op == IR_PARAM && t->frozen; }

spmd_status spmd_param_freeze(spmd_tensor *p)
{
    if (!p) return base_error(SPMD_ERR_INVALID, "param_freeze: tensor is NULL");
    if (p->op != IR_PARAM)
        return base_error(SPMD_ERR_INVALID, "param_freeze: '%s' is not a parameter (its op is %s)",
                          p->name ? p->name : "(unnamed)", ir_op_name(p->op));
    if (p->graph->has_grad && !p->frozen)
        return base_error(SPMD_ERR_INVALID,
                          "param_freeze: '%s': the graph has its backward pass already "
                          "(freeze before spmd_grad)", p->name);
    p->frozen = true;
    return SPMD_OK;
}
spmd_tensor *spmd_tensor_grad(const spmd_tensor *t) { return t ? t->grad : NULL; }

spmd_status spmd_tensor_set_name(spmd_tensor *t, const char *name)
{
    if (!t) return base_error(SPMD_ERR_INVALID, "set_name: tensor is NULL");
    spmd_graph *g = t->graph;
    if (t->name && name && strcmp(t->name, name) == 0) return SPMD_OK;
    if (!name_ok(g, name, "set_name")) return base_error_status(); /* taken, or no memory */
    char *copy = base_arena_strdup(&g->arena, name);
    if (!copy) return SPMD_ERR_NOMEM;
    t->name = copy;
    index_put(g, t); /* its old name's slot no longer matches */
    return SPMD_OK;
}

const char *spmd_tensor_signature(const spmd_tensor *t, char *buf, size_t size)
{
    ir_dimsig sig;
    if (!t || !buf || size == 0) return "";
    if (!ir_signature(t, &sig)) {
        snprintf(buf, size, "(%s: explicit rule)", ir_op_name(t->op));
        return buf;
    }
    ir_signature_format(&sig, buf, size);
    return buf;
}

spmd_tensor *spmd_graph_find(const spmd_graph *g, const char *name)
{
    if (!g || !name || !g->cap_names) return NULL;
    size_t mask = (size_t)g->cap_names - 1;
    for (size_t i = (size_t)name_hash(name) & mask; g->names[i]; i = (i + 1) & mask) {
        name_compares++;
        if (strcmp(g->names[i]->name, name) == 0) return g->names[i];
    }
    return NULL;
}

int spmd_graph_tensor_count(const spmd_graph *g) { return g ? g->n_nodes : 0; }

spmd_tensor *spmd_graph_tensor(const spmd_graph *g, int index)
{
    if (!g || index < 0 || index >= g->n_nodes) return NULL;
    return g->nodes[index];
}

int64_t spmd_graph_param_count(const spmd_graph *g)
{
    int64_t n = 0;
    for (int i = 0; g && i < g->n_nodes; i++)
        if (ir_is_trained(g->nodes[i])) n += ir_numel(g->nodes[i]);
    return n;
}

/* ---- Op table: ops.def's columns the layers above read ----------------------------------------------- */

static const char *const op_names[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) name,
#include "ir/ops.def"
#undef OP
};

static const int op_arity[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) arity,
#include "ir/ops.def"
#undef OP
};

static const bool op_carries_groups[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) groups,
#include "ir/ops.def"
#undef OP
};

/* The formula column read as the operands its formula takes; its
 * expression is the runtime's (kernels_ops.h). */
#define EW_NONE 0
#define EW_UNARY(...) 1
#define EW_BINARY(...) 2
#define EW_TERNARY(...) 3
static const int8_t op_formula_arity[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) formula,
#include "ir/ops.def"
#undef OP
};
#undef EW_NONE
#undef EW_UNARY
#undef EW_BINARY
#undef EW_TERNARY

static const ir_op_kind op_kind[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) IR_##kind,
#include "ir/ops.def"
#undef OP
};

/* The bf16 column as a mask: bit j for operand j, BF16_OUT for the result. */
enum { BF16_OUT = 1u << 15 };
#define BF16_NO 0u
#define BF16_READS(mask) (mask)
#define BF16_MOVES (BF16_OUT | ((1u << IR_MAX_INPUTS) - 1u))
static const uint16_t op_bf16[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) bf16,
#include "ir/ops.def"
#undef OP
};
#undef BF16_NO
#undef BF16_READS
#undef BF16_MOVES

/* Whether the row's kernel is kern_formula (ir/op_columns.h), and its
 * formula as written, which says whether it reads the constant c. */
static const bool op_plain[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) \
    IR_IS_FORMULA_KERNEL(kern),
#include "ir/ops.def"
#undef OP
};

static const char *const op_formula_text[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) #formula,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof op_names / sizeof op_names[0] == IR_OP_COUNT, "op table out of step");
_Static_assert(sizeof op_plain / sizeof op_plain[0] == IR_OP_COUNT, "op table out of step");
_Static_assert(sizeof op_formula_text / sizeof op_formula_text[0] == IR_OP_COUNT,
               "op table out of step");
_Static_assert(sizeof op_kind / sizeof op_kind[0] == IR_OP_COUNT, "op table out of step");
_Static_assert(sizeof op_bf16 / sizeof op_bf16[0] == IR_OP_COUNT, "op table out of step");
_Static_assert(sizeof op_arity / sizeof op_arity[0] == IR_OP_COUNT, "op table out of step");
_Static_assert(sizeof op_carries_groups / sizeof op_carries_groups[0] == IR_OP_COUNT,
               "op table out of step");
_Static_assert(sizeof op_formula_arity / sizeof op_formula_arity[0] == IR_OP_COUNT,
               "op table out of step");

const char *ir_op_name(ir_op op) { return (unsigned)op < IR_OP_COUNT ? op_names[op] : "?"; }
int ir_op_arity(ir_op op) { return (unsigned)op < IR_OP_COUNT ? op_arity[op] : 0; }
bool ir_op_carries_groups(ir_op op) { return (unsigned)op < IR_OP_COUNT && op_carries_groups[op]; }
int ir_op_formula_arity(ir_op op) { return (unsigned)op < IR_OP_COUNT ? op_formula_arity[op] : 0; }
/* The backward helpers (gelu_backward, ...) have formula kernels too, but
 * no backward rule: only autodiff builds them. */
bool ir_op_is_plain_elementwise(ir_op op)
{
    return (unsigned)op < IR_OP_COUNT && op_plain[op] && ir_op_has_vjp(op);
}

static bool ident_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

bool ir_op_reads_constant(ir_op op)
{
    if (ir_op_formula_arity(op) != 1) return false;
    const char *s = op_formula_text[op];
    for (size_t i = 0; s[i]; i++)
        if (s[i] == 'c' && (i == 0 || !ident_char(s[i - 1])) && !ident_char(s[i + 1])) return true;
    return false;
}

int spmd_op_count(void) { return IR_OP_COUNT; }

spmd_status spmd_op_describe(int index, spmd_op_info *info)
{
    if (!info || index < 0 || index >= IR_OP_COUNT)
        return base_error(SPMD_ERR_INVALID, "op_describe: no op %d (there are %d)%s", index,
                          IR_OP_COUNT, info ? "" : "; info is NULL");
    ir_op op = (ir_op)index;
    *info = (spmd_op_info){.name = op_names[op],
                           .arity = op_arity[op],
                           .elementwise = ir_op_is_plain_elementwise(op),
                           .constant = ir_op_reads_constant(op),
                           .differentiable = ir_op_has_vjp(op)};
    return SPMD_OK;
}

int ir_op_lookup(const char *name)
{
    for (int op = 0; name && op < IR_OP_COUNT; op++)
        if (!strcmp(op_names[op], name)) return op;
    return -1;
}

ir_op_kind ir_op_kind_of(ir_op op) { return (unsigned)op < IR_OP_COUNT ? op_kind[op] : IR_KIND_COMPUTE; }
bool ir_op_is_leaf(ir_op op) { return ir_op_kind_of(op) == IR_KIND_LEAF; }
bool ir_is_persistent(const spmd_tensor *t) { return t->op == IR_PARAM || t->op == IR_STATE; }
bool ir_is_trained(const spmd_tensor *t) { return t->op == IR_PARAM && !t->frozen; }
bool ir_op_is_collective(ir_op op)
{
    ir_op_kind k = ir_op_kind_of(op);
    return k == IR_KIND_COLLECTIVE || k == IR_KIND_FLIES;
}
bool ir_op_may_fly(ir_op op) { return ir_op_kind_of(op) == IR_KIND_FLIES; }
bool ir_op_reads_bf16(ir_op op, int operand)
{
    return (unsigned)op < IR_OP_COUNT && operand >= 0 && operand < IR_MAX_INPUTS &&
           (op_bf16[op] >> operand & 1u);
}
bool ir_op_makes_bf16(ir_op op) { return (unsigned)op < IR_OP_COUNT && (op_bf16[op] & BF16_OUT); }

bool ir_is_param_copy(const spmd_tensor *t) { return t->op == IR_CONVERT && t->in[0]->op == IR_PARAM; }
