/*
 * Dropout's kernel (docs/DESIGN.md, "Random numbers").  Element i of the
 * whole tensor is dropped when 32 bits of Philox-4x32-10 fall below
 * p * 2^32: the bits are lane i % 4 of the block for counter (i / 4, 0),
 * under the key of (seed, step, micro-batch, site) (base_philox_key).  A
 * device finds each of its elements' global index from where its block
 * lies (the attributes fix_dropout set, and its member rank in each
 * dim's group), so every mesh, thread count and process count draws the
 * same mask.
 */
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/kernels_ops.h"

#include "base/rng.h"

/* Where a device's block of one dim lies: local index j is global index
 * (j / per) * stride + start + j % per, padding from `limit` on (a plain
 * split is one group of `per`; a grouped one, groups of `per`). */
typedef struct dim_map {
    int64_t per, stride, start, limit;
} dim_map;

static dim_map map_of(const kern_args *a, int d)
{
    const spmd_tensor *t = a->node;
    int64_t local = t->dims[d], global = t->attr.dropout.global[d];
    int spec = t->attr.dropout.spec[d];
    if (spec < 0 || !a->dev) return (dim_map){local ? local : 1, global, 0, global};
    int64_t groups = t->attr.dropout.groups[d] > 1 ? t->attr.dropout.groups[d] : 1;
    int64_t per = local / groups, block = a->dev->member[spec];
    /* A grouped split cuts every group exactly: no padding. */
    int64_t start = block * per, limit = groups > 1 ? per * (block + 1) : global;
    return (dim_map){per ? per : 1, global / groups, start, limit};
}

/* Global index along the dim, or -1 for padding. */
static int64_t global_of(const dim_map *m, int64_t j)
{
    int64_t at = m->start + j % m->per;
    return at < m->limit ? (j / m->per) * m->stride + at : -1;
}

/* The step as the count it holds: a whole number in f32, read as 0 when
 * it is not one a count can be (negative, NaN). */
static uint64_t step_count(float step)
{
    return step >= 1.0f && step < 18446744073709551616.0f ? (uint64_t)step : 0;
}

void kern_dropout(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const float *x = a->in[0];
    float *y = a->out;
    float p = t->attr.dropout.p;
    uint64_t step = step_count(*(const float *)a->in[1]);
    uint32_t words[4] = {(uint32_t)step, (uint32_t)(step >> 32), (uint32_t)a->micro,
                         (uint32_t)t->attr.dropout.site};
    uint32_t key[2];
    base_philox_key(a->seed, words, key);
    /* Dropped when the bits are below p * 2^32 (exact in double): never
     * at p = 0, always at p = 1. */
    uint64_t below = (uint64_t)((double)p * 4294967296.0);
    float scale = (float)(1.0 / (1.0 - (double)p));

    int rank = t->rank, last = rank - 1;
    dim_map map[SPMD_MAX_RANK];
    int64_t gstride[SPMD_MAX_RANK], s = 1;
    for (int d = last; d >= 0; d--) {
        map[d] = map_of(a, d);
        gstride[d] = s;
        s *= t->attr.dropout.global[d];
    }
    /* The last dim in runs of `per` elements (one run unless its split is
     * grouped), each run's global indices consecutive. */
    dim_map row = rank ? map[last] : (dim_map){1, 1, 0, 1};
    int64_t cols = rank ? t->dims[last] : 1, rows = cols ? kn_numel(t) / cols : 0;
    int64_t lo, hi;
    kern_split(rows, a->ith, a->nth, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        /* The row's global offset, from its index along each outer dim. */
        int64_t base = 0, rest = r;
        for (int d = last - 1; d >= 0 && base >= 0; d--) {
            int64_t g = global_of(&map[d], rest % t->dims[d]);
            rest /= t->dims[d];
            base = g < 0 ? -1 : base + g * gstride[d];
        }
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        uint64_t block = UINT64_MAX; /* the counter whose bits `bits` holds */
        uint32_t bits[4] = {0};
        for (int64_t j0 = 0; j0 < cols; j0 += row.per) {
            int64_t first = base + (j0 / row.per) * row.stride + row.start;
            for (int64_t w = 0; w < row.per && j0 + w < cols; w++) {
                if (base < 0 || row.start + w >= row.limit) { /* padding */
                    yr[j0 + w] = 0.0f;
                    continue;
                }
                uint64_t i = (uint64_t)(first + w);
                if (i / 4 != block) {
                    block = i / 4;
                    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
                    base_philox4x32(ctr, key, bits);
                }
                yr[j0 + w] = bits[i % 4] >= below ? xr[j0 + w] * scale : 0.0f;
            }
        }
    }
}
