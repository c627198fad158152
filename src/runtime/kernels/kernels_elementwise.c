/*
 * Elementwise kernels: fill, expand, where, convert, and kern_formula, the
 * kernel of every op whose row in ops.def gives its formula and asks for
 * the standard loop (the unary ops, the broadcasting binary ones, the
 * backward helpers of the activations).  Every output element is a
 * function of its own inputs only, so any split over threads gives the
 * same bits; the split is by contiguous runs of 16 elements (64 bytes) so
 * that threads never share a cache line.
 */
#include "runtime/kernels/kernels_ops.h"

#include "ir/op_columns.h"

#include "base/bf16.h"

#include <math.h>
#include <string.h>

enum { EW_ALIGN = 16 };

/* ---- fill ------------------------------------------------------------------ */

/* out [...] = value (f32, or i32 when the node says so). */
void kern_fill(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    int64_t b, e;
    kern_split(kn_numel(t), a->ith, a->nth, EW_ALIGN, &b, &e);
    if (t->dtype == SPMD_I32) {
        int32_t *restrict out = a->out;
        int32_t v = (int32_t)t->attr.fill.value;
        for (int64_t i = b; i < e; i++) out[i] = v;
    } else {
        float *restrict out = a->out;
        float v = t->attr.fill.value;
        for (int64_t i = b; i < e; i++) out[i] = v;
    }
}

/* ---- Broadcasting ---------------------------------------------------------- */

/*
 * A broadcast is described by the output's dims and, for each operand, an
 * element stride per output dim (0 where the operand is broadcast).  Output
 * dims of size 1 are dropped and neighbouring dims merged when every
 * operand walks them as one, so the common cases collapse to rank 1 (same
 * shape, scalar operand) or rank 2 (bias [N] over [M, N]).  After that the
 * innermost stride of each operand is 0 or 1, which gives four simple,
 * vectorisable inner loops.
 */
typedef struct bc_plan {
    int rank; /* >= 1 */
    int64_t dims[SPMD_MAX_RANK];
    int64_t sa[SPMD_MAX_RANK], sb[SPMD_MAX_RANK], sc[SPMD_MAX_RANK];
} bc_plan;

/* Strides of operand x (x's dims right-aligned to the output's). */
static void bc_strides(const spmd_tensor *out, const spmd_tensor *x, int64_t *s)
{
    int r = out->rank, off = r - x->rank;
    int64_t stride = 1;
    for (int i = r - 1; i >= 0; i--) {
        int64_t d = i >= off ? x->dims[i - off] : 1;
        s[i] = d == 1 ? 0 : stride;
        stride *= d;
    }
}

/* `y` and `z` may be NULL (expand, the binary ops): their strides are
 * then all zero, which merges wherever the others do. */
static void bc_plan_make(const spmd_tensor *out, const spmd_tensor *x, const spmd_tensor *y,
                         const spmd_tensor *z, bc_plan *p)
{
    int64_t sx[SPMD_MAX_RANK], sy[SPMD_MAX_RANK] = {0}, sz[SPMD_MAX_RANK] = {0};
    bc_strides(out, x, sx);
    if (y) bc_strides(out, y, sy);
    if (z) bc_strides(out, z, sz);
    int n = 0;
    for (int i = 0; i < out->rank; i++) {
        int64_t d = out->dims[i];
        if (d == 1) continue;
        if (n > 0 && sx[i] * d == p->sa[n - 1] && sy[i] * d == p->sb[n - 1] &&
            sz[i] * d == p->sc[n - 1]) {
            /* Dim n-1 steps exactly over dim i for all: one dim. */
            p->dims[n - 1] *= d;
            p->sa[n - 1] = sx[i];
            p->sb[n - 1] = sy[i];
            p->sc[n - 1] = sz[i];
            continue;
        }
        p->dims[n] = d;
        p->sa[n] = sx[i];
        p->sb[n] = sy[i];
        p->sc[n] = sz[i];
        n++;
    }
    if (n == 0) {
        p->dims[0] = 1;
        p->sa[0] = p->sb[0] = p->sc[0] = 0;
        n = 1;
    }
    p->rank = n;
}

/* Offsets of the operands at the start of output row `row` (a row being
 * the innermost plan dim); oc may be NULL. */
static void bc_row_offsets(const bc_plan *p, int64_t row, int64_t *oa, int64_t *ob, int64_t *oc)
{
    int64_t xa = 0, xb = 0, xc = 0;
    for (int d = p->rank - 2; d >= 0; d--) {
        int64_t i = row % p->dims[d];
        row /= p->dims[d];
        xa += i * p->sa[d];
        xb += i * p->sb[d];
        xc += i * p->sc[d];
    }
    *oa = xa;
    *ob = xb;
    if (oc) *oc = xc;
}

/* out[e0:e1) of a broadcast binary op, OPF its formula (ew_<ENUM>,
 * kernels_ops.h); each run of a row gets one of four inner loops by the
 * operands' innermost strides. */
#define DEFINE_BROADCAST(OPF)                                                        \
    static void bc_##OPF(const bc_plan *p, const float *x, const float *y,           \
                         float *out, int64_t e0, int64_t e1)                         \
    {                                                                                \
        const int64_t len = p->dims[p->rank - 1];                                    \
        const int64_t ia = p->sa[p->rank - 1], ib = p->sb[p->rank - 1];              \
        for (int64_t e = e0; e < e1;) {                                              \
            int64_t row = e / len, col = e % len, oa, ob;                            \
            int64_t n = kn_min(len - col, e1 - e);                                   \
            bc_row_offsets(p, row, &oa, &ob, NULL);                                  \
            const float *restrict pa = x + oa + col * ia;                            \
            const float *restrict pb = y + ob + col * ib;                            \
            float *restrict po = out + e;                                            \
            if (ia && ib) {                                                          \
                for (int64_t i = 0; i < n; i++) po[i] = OPF(pa[i], pb[i]);           \
            } else if (ia) {                                                         \
                const float vb = pb[0];                                              \
                for (int64_t i = 0; i < n; i++) po[i] = OPF(pa[i], vb);              \
            } else if (ib) {                                                         \
                const float va = pa[0];                                              \
                for (int64_t i = 0; i < n; i++) po[i] = OPF(va, pb[i]);              \
            } else {                                                                 \
                const float v = OPF(pa[0], pb[0]);                                   \
                for (int64_t i = 0; i < n; i++) po[i] = v;                           \
            }                                                                        \
            e += n;                                                                  \
        }                                                                            \
    }

/* out = a op b, numpy broadcasting: a [..], b [..] -> out [max rank]. */
#define DEFINE_BINARY_KERNEL(NAME, OPF)                                              \
    DEFINE_BROADCAST(OPF)                                                            \
    static void NAME(const kern_args *a)                                             \
    {                                                                                \
        const spmd_tensor *t = a->node;                                              \
        bc_plan p;                                                                   \
        bc_plan_make(t, t->in[0], t->in[1], NULL, &p);                               \
        int64_t b, e;                                                                \
        kern_split(kn_numel(t), a->ith, a->nth, EW_ALIGN, &b, &e);                   \
        bc_##OPF(&p, a->in[0], a->in[1], a->out, b, e);                              \
    }

/* x [..] broadcast to out [..].  Moves raw 32-bit elements, so it works
 * for i32 as well and copies NaN payloads untouched. */
void kern_expand(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    bc_plan p;
    bc_plan_make(t, t->in[0], NULL, NULL, &p);
    int64_t b, e;
    kern_split(kn_numel(t), a->ith, a->nth, EW_ALIGN, &b, &e);
    const uint32_t *x = a->in[0];
    uint32_t *out = a->out;
    const int64_t len = p.dims[p.rank - 1], ia = p.sa[p.rank - 1];
    for (int64_t i = b; i < e;) {
        int64_t row = i / len, col = i % len, oa, ob;
        int64_t n = kn_min(len - col, e - i);
        bc_row_offsets(&p, row, &oa, &ob, NULL);
        if (ia) {
            memcpy(out + i, x + oa + col, (size_t)n * sizeof *out);
        } else {
            const uint32_t v = x[oa];
            uint32_t *restrict po = out + i;
            for (int64_t j = 0; j < n; j++) po[j] = v;
        }
        i += n;
    }
}

/* out = where(cond, a, b), numpy broadcasting over the three, by the
 * formula ew_WHERE.  An i32 condition is read as the float it converts
 * to, which is nonzero exactly when the integer is. */
#define WHERE_ROWS(LOAD_COND)                                                        \
    do {                                                                             \
        for (int64_t e = e0; e < e1;) {                                              \
            int64_t row = e / len, col = e % len, oc, oa, ob;                        \
            int64_t n = kn_min(len - col, e1 - e);                                   \
            bc_row_offsets(&p, row, &oc, &oa, &ob);                                  \
            oc += col * ic, oa += col * ia, ob += col * ib;                          \
            float *restrict po = out + e;                                            \
            if (ic && ia && ib)                                                      \
                for (int64_t i = 0; i < n; i++)                                      \
                    po[i] = ew_WHERE(LOAD_COND(oc + i), xa[oa + i], xb[ob + i]);     \
            else                                                                     \
                for (int64_t i = 0; i < n; i++)                                      \
                    po[i] = ew_WHERE(LOAD_COND(oc + i * ic), xa[oa + i * ia],        \
                                     xb[ob + i * ib]);                               \
            e += n;                                                                  \
        }                                                                            \
    } while (0)

void kern_where(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    bc_plan p;
    bc_plan_make(t, t->in[0], t->in[1], t->in[2], &p);
    int64_t e0, e1;
    kern_split(kn_numel(t), a->ith, a->nth, EW_ALIGN, &e0, &e1);
    const int64_t len = p.dims[p.rank - 1];
    const int64_t ic = p.sa[p.rank - 1], ia = p.sb[p.rank - 1], ib = p.sc[p.rank - 1];
    const float *xa = a->in[1], *xb = a->in[2];
    float *out = a->out;
    if (t->in[0]->dtype == SPMD_I32) {
        const int32_t *cond = a->in[0];
#define COND_I32(k) ((float)cond[k])
        WHERE_ROWS(COND_I32);
#undef COND_I32
    } else {
        const float *cond = a->in[0];
#define COND_F32(k) (cond[k])
        WHERE_ROWS(COND_F32);
#undef COND_F32
    }
}

/* ---- Unary ------------------------------------------------------------------ */

/* y [..] = f(x [..], c), f the op's formula (ew_<ENUM>, kernels_ops.h)
 * and c the node's attr.scale.c (scale's factor). */
#define DEFINE_UNARY_KERNEL(NAME, F)                                                 \
    static void NAME(const kern_args *a)                                                    \
    {                                                                                \
        int64_t b, e;                                                                \
        kern_split(kn_numel(a->node), a->ith, a->nth, EW_ALIGN, &b, &e);             \
        const float *restrict in = a->in[0];                                         \
        float *restrict out = a->out;                                                \
        const float c = a->node->attr.scale.c;                                       \
        for (int64_t i = b; i < e; i++) out[i] = F(in[i], c);                        \
    }

/* Backward helpers: (x [..], dy [..]) -> dx [..] = F(x, dy), F the op's
 * formula.  x may be bf16 (an activation kept in bf16 under mixed
 * precision, ir/autocast.c): each element is widened exactly. */
#define DEFINE_GRAD_KERNEL(NAME, F)                                                  \
    static void NAME(const kern_args *a)                                                    \
    {                                                                                \
        int64_t b, e;                                                                \
        kern_split(kn_numel(a->node), a->ith, a->nth, EW_ALIGN, &b, &e);             \
        const float *restrict dys = a->in[1];                                        \
        float *restrict out = a->out;                                                \
        if (a->node->in[0]->dtype == SPMD_BF16) {                                    \
            const bf16_bits *restrict xh = a->in[0];                                 \
            for (int64_t i = b; i < e; i++) out[i] = F(bf16_to_f32(xh[i]), dys[i]);  \
            return;                                                                  \
        }                                                                            \
        const float *restrict xs = a->in[0];                                         \
        for (int64_t i = b; i < e; i++) out[i] = F(xs[i], dys[i]);                   \
    }

/* ---- kern_formula: the kernels made from ops.def's formula column ----------- */

/* One kernel per such row, its loop chosen by the formula's arity and the
 * row's signature: unary ops are elementwise; binary ones broadcast
 * (sig_broadcast) or are backward helpers of the same shapes reading a
 * kept activation that may be bf16 (sig_elementwise).  Any other pairing
 * does not compile. */
#define KN_KERNEL(e, sig, kind, ...) KN_KERNEL_##kind(e, sig)
#define KN_KERNEL_KN_EW_UNARY(e, sig) KN_UNARY_##sig(e)
#define KN_KERNEL_KN_EW_BINARY(e, sig) KN_BINARY_##sig(e)
#define KN_UNARY_sig_elementwise(e) DEFINE_UNARY_KERNEL(formula_##e, ew_##e)
#define KN_BINARY_sig_broadcast(e) DEFINE_BINARY_KERNEL(formula_##e, ew_##e)
#define KN_BINARY_sig_elementwise(e) DEFINE_GRAD_KERNEL(formula_##e, ew_##e)

#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16)  \
    IR_WHEN(IR_IS_FORMULA_KERNEL(kern), KN_KERNEL(e, sig, formula))
#include "ir/ops.def"
#undef OP

/* The kernel of every row whose kernel column says kern_formula: the
 * node's op picks its loop (one branch per call, none per element). */
void kern_formula(const kern_args *a)
{
    switch (a->node->op) {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16)  \
    IR_WHEN(IR_IS_FORMULA_KERNEL(kern), case IR_##e : formula_##e(a); return;)
#include "ir/ops.def"
#undef OP
    default: break;
    }
    kern_fail(a, SPMD_ERR_INTERNAL, "kern_formula: %s has no elementwise formula (ops.def)",
              ir_op_name(a->node->op));
}

/* x in the node's type: f32 -> bf16 rounded to nearest even, bf16 -> f32
 * exactly (base/bf16.h, the one rounding every part of libspmd uses). */
void kern_convert(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    int64_t b, e;
    /* Runs of 64 bytes of bf16 too: no two threads write one cache line. */
    kern_split(kn_numel(t), a->ith, a->nth, t->dtype == SPMD_BF16 ? 2 * EW_ALIGN : EW_ALIGN, &b, &e);
    if (e <= b) return;
    if (t->dtype == SPMD_BF16)
        bf16_from_f32_n((bf16_bits *)a->out + b, (const float *)a->in[0] + b, (size_t)(e - b));
    else
        bf16_to_f32_n((float *)a->out + b, (const bf16_bits *)a->in[0] + b, (size_t)(e - b));
}
