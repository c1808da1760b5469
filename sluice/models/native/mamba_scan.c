/* Mamba-2's selective scan (sluice/models/mamba2_scan.py), token by token,
 * for every head of every sequence of a step; per head h (group g):
 *
 *     S <- S * decay_t + (dt_t B_t) x_t      S [head_dim, N] float32
 *     y_t = S . C_t                          (N products summed in a fixed order)
 *
 * x [T, heads, head_dim], dt and decay [T, heads] (torch computes them, as
 * every activation, on fixed row tiles), B and C [T, groups, N], y [T, heads,
 * head_dim], all float32 and contiguous. The heads of a group are
 * consecutive (heads / groups each).
 *
 * Every token runs the same operations in the same order: the update is
 * elementwise, and S . C sums in 16 lane partials then halving
 * (recurrent_spans.h), the same for every token; no fast-math and no FMA
 * contraction (the pragmas), so vectorised and scalar builds give the same
 * bits and a sequence's state depends on its own tokens only. Spans and
 * saves (where states start and which are copied where): recurrent_spans.h.
 * Work: (sequence, head) pairs over OpenMP threads. */
#include <stdint.h>
#include <stdlib.h>

#include "recurrent_spans.h"
#include "sluice_abi.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

typedef struct {
    const float *x, *dt, *decay, *b_in, *c_out;
    int64_t num_heads, head_dim, num_groups, state_size;
    float *y;
} Scan;

/* Token t through head h's state s [head_dim, N]; scratch: N floats. */
static void scan_token(const Scan *p, int64_t t, int64_t h, float *s, float *scratch) {
    const int64_t n = p->state_size, dim = p->head_dim;
    const int64_t g = h / (p->num_heads / p->num_groups);
    const int64_t th = t * p->num_heads + h;
    const float dt = p->dt[th], decay = p->decay[th];
    const float *b = p->b_in + (t * p->num_groups + g) * n;
    const float *c = p->c_out + (t * p->num_groups + g) * n;
    const float *x = p->x + th * dim;
    float *y = p->y + th * dim;
    for (int64_t j = 0; j < n; j++) scratch[j] = dt * b[j];
    for (int64_t i = 0; i < dim; i++) {
        float *si = s + i * n;
        const float xi = x[i];
        for (int64_t j = 0; j < n; j++) si[j] = si[j] * decay + scratch[j] * xi;
        y[i] = fixed_sum_of_products(si, c, n);
    }
}

static void scan_step(const void *p, int64_t t, int64_t h, float *s, float *scratch) {
    scan_token(p, t, h, s, scratch);
}

int mamba_scan_f32(const float *x, const float *dt, const float *decay, const float *b_in,
                   const float *c_out, const int64_t *spans, int64_t num_seqs,
                   const int64_t *saves, int64_t num_saves, float *cache, int64_t cache_rows,
                   int64_t cache_stride, float *kept, int64_t kept_rows, int64_t kept_stride,
                   int64_t num_heads, int64_t head_dim, int64_t num_groups, int64_t state_size,
                   float *y) {
    if (num_groups <= 0 || num_heads % num_groups != 0 || head_dim <= 0 || state_size <= 0)
        return -1;
    const int64_t head_numel = head_dim * state_size;
    const RecurrentRows rows = {spans, num_seqs, saves, num_saves, cache, cache_rows,
                                cache_stride, kept, kept_rows, kept_stride,
                                num_heads * head_numel};
    const Scan p = {x, dt, decay, b_in, c_out, num_heads, head_dim, num_groups, state_size, y};
    return recurrent_walk(&rows, num_heads, head_numel, state_size, scan_step, &p);
}
