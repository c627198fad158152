/*
 * A fused group of elementwise nodes (compile/fuse.h) in one pass: each
 * thread takes its elements of the root in blocks of FUSE_BLOCK and, per
 * block, computes every member in order into its scratch (the root into
 * the output; a stored member also to its memory), so the members'
 * values never leave the cache.  Each member
 * computes each element as its own kernel does (kernels_elementwise.c, the
 * same functions), so the bits are the unfused program's.
 */
#include "compile/fuse.h"
#include "runtime/kernels_ops.h"

enum { FUSED_ALIGN = 16 };

_Static_assert(FUSE_MAX_STORED <= sizeof ((kern_args *)0)->stored / sizeof(void *),
               "kern_args.stored holds every stored member of a group");

/* Operand `src` of a member, elements [at, at + n) of the root, as a
 * pointer: a member's block in scratch, an input read in place, or a
 * broadcast input unrolled into `spare`.  *scalar says a one-element
 * input, whose value is then *value. */
static const float *operand(const kern_args *a, const fuse_group *g, const float *slots, int src,
                            int64_t at, int64_t n, float *spare, bool *scalar, float *value)
{
    *scalar = false;
    if (src >= 0) return slots + (size_t)src * FUSE_BLOCK;
    int k = -1 - src;
    const float *x = a->in[k];
    int64_t nx = g->in_numel[k];
    if (nx == 1) {
        *scalar = true;
        *value = x[0];
        return NULL;
    }
    if (nx == kn_numel(g->root)) return x + at;
    /* A trailing block repeated: element i of the root reads i % nx. */
    for (int64_t i = 0, j = at % nx; i < n; i++) {
        spare[i] = x[j];
        if (++j == nx) j = 0;
    }
    return spare;
}

/* One member over n elements: out[i] = op(x[i], y[i]), a scalar operand
 * broadcast as the binary kernels broadcast it. */
static void run_step(const fuse_step *s, const float *restrict x, bool xs, float xv,
                     const float *restrict y, bool ys, float yv, float *restrict out, int64_t n)
{
#define BINARY(OPX)                                                                            \
    do {                                                                                       \
        if (!xs && !ys)                                                                        \
            for (int64_t i = 0; i < n; i++) out[i] = OPX(x[i], y[i]);                          \
        else if (!xs)                                                                          \
            for (int64_t i = 0; i < n; i++) out[i] = OPX(x[i], yv);                            \
        else if (!ys)                                                                          \
            for (int64_t i = 0; i < n; i++) out[i] = OPX(xv, y[i]);                            \
        else                                                                                   \
            for (int64_t i = 0; i < n; i++) out[i] = OPX(xv, yv);                              \
    } while (0)
#define UNARY(EXPR)                                                                            \
    do {                                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                      \
            const float v = xs ? xv : x[i];                                                    \
            out[i] = (EXPR);                                                                   \
        }                                                                                      \
    } while (0)
#define OP_ADD(p, q) ((p) + (q))
#define OP_SUB(p, q) ((p) - (q))
#define OP_MUL(p, q) ((p) * (q))
#define OP_DIV(p, q) ((p) / (q))
#define OP_GELU_BACKWARD(p, q) ((q) * kn_gelu_grad(p))
#define OP_RELU_BACKWARD(p, q) ((p) > 0.0f ? (q) : 0.0f)
    const float c = s->c;
    switch (s->op) {
    case IR_ADD: BINARY(OP_ADD); break;
    case IR_SUB: BINARY(OP_SUB); break;
    case IR_MUL: BINARY(OP_MUL); break;
    case IR_DIV: BINARY(OP_DIV); break;
    case IR_GELU_BACKWARD: BINARY(OP_GELU_BACKWARD); break;
    case IR_RELU_BACKWARD: BINARY(OP_RELU_BACKWARD); break;
    case IR_EXPAND: UNARY(v); break;
    case IR_SCALE: UNARY(v * c); break;
    case IR_NEG: UNARY(-v); break;
    case IR_EXP: UNARY(expf(v)); break;
    case IR_LOG: UNARY(logf(v)); break;
    case IR_TANH: UNARY(tanhf(v)); break;
    case IR_SQRT: UNARY(sqrtf(v)); break;
    case IR_RSQRT: UNARY(kn_rsqrt(v)); break;
    case IR_RELU: UNARY(kn_relu(v)); break;
    case IR_GELU: UNARY(kn_gelu(v)); break;
    default: break; /* fusion_build admits only the ops above */
    }
#undef BINARY
#undef UNARY
}

void kern_fused(const kern_args *a)
{
    const fuse_group *g = a->fused;
    int64_t b, e;
    kern_split(kn_numel(g->root), a->ith, a->nth, FUSED_ALIGN, &b, &e);
    float *slots = a->scratch;
    float *spare = slots + (size_t)g->n_steps * FUSE_BLOCK;
    float *out = a->out;
    for (int64_t at = b; at < e; at += FUSE_BLOCK) {
        int64_t n = kn_min(FUSE_BLOCK, e - at);
        for (int k = 0; k < g->n_steps; k++) {
            const fuse_step *s = &g->steps[k];
            bool xs = false, ys = false;
            float xv = 0, yv = 0;
            const float *x = operand(a, g, slots, s->src[0], at, n, spare, &xs, &xv);
            bool binary = s->op == IR_ADD || s->op == IR_SUB || s->op == IR_MUL ||
                          s->op == IR_DIV || s->op == IR_GELU_BACKWARD || s->op == IR_RELU_BACKWARD;
            const float *y = binary ? operand(a, g, slots, s->src[1], at, n, spare + FUSE_BLOCK, &ys, &yv)
                                    : NULL;
            float *o = k == g->n_steps - 1 ? out + at : slots + (size_t)k * FUSE_BLOCK;
            run_step(s, x, xs, xv, y, ys, yv, o, n);
            if (s->stored >= 0) memcpy((float *)a->stored[s->stored] + at, o, (size_t)n * sizeof *o);
        }
    }
}
