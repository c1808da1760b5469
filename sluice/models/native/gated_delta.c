/* Qwen3.5's gated delta rule (sluice/models/gated_deltanet.py), token by
 * token, for every value head of every sequence of a step:
 *
 *     q, k, v = silu(conv)                  (rounded to the model dtype)
 *     q, k   <- l2norm(q), l2norm(k);  q <- q / sqrt(dk)
 *     beta    = sigmoid(b)                  (rounded to the model dtype)
 *     S      <- S * exp(g),  g = -exp(A_log) * softplus(a + dt_bias)
 *     S      <- S + k (x) (v - S^T k) * beta
 *     o       = S^T q                       (rounded to the model dtype)
 *     out     = rms_norm(o) * w * silu(z)   (per head, transformers' gated norm)
 *
 * with the model dtype's roundings where `bf16` is 1 (inputs and outputs
 * pass as float32; torch converts them exactly). S [dk, dv] is float32.
 *
 * Exactness: every token of every sequence runs the same operations in the
 * same order (sums over dk in dk's order, per dv lane; the norms' sums in
 * fixed 16-lane partials), so a sequence's states and outputs depend on its
 * own tokens only: not on the chunking of its prompt, its neighbours, a
 * prefix hit or verified drafts. No fast-math and no FMA contraction here
 * (the pragmas): a build that vectorises the dv lanes with AVX-512 and a
 * scalar build give the same bits, because each lane is its own sequence of
 * IEEE operations. Work: (sequence, value head) pairs over OpenMP threads.
 *
 * Per sequence (spans [num_seqs, 3]): its first token, its number of tokens,
 * the cache row its state starts from (-1: zeros). Saves [num_saves, 3],
 * sorted by sequence then m: (sequence, m, target): the state after its
 * first m tokens is copied to cache row `target`, or, where target < 0, to
 * kept row -1 - target. Row r's state starts at cache + r * cache_stride. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "recurrent_spans.h"
#include "sluice_abi.h"
#include "vector_exp.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

#define L2NORM_EPS 1e-6f

typedef struct {
    const float *conv, *z, *b, *a, *neg_a, *dt_bias, *norm_weight;
    int64_t num_k_heads, num_v_heads, dk, dv;
    float eps;
    int bf16;
    float *out;
} Delta;

static inline float rnd(int bf16, float x) { return bf16 ? bf16_round(x) : x; }

static inline float silu(float x) { return x / (1.0f + vector_expf(-x)); }

/* silu of n inputs, rounded; then, if `l2`, times 1 / sqrt(sum of squares + eps) / divisor. */
static void activate(const float *in, int64_t n, int bf16, int l2, float divisor, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = rnd(bf16, silu(in[i]));
    if (!l2) return;
    const float inv = 1.0f / sqrtf(fixed_sum_of_products(out, out, n) + L2NORM_EPS);
    for (int64_t i = 0; i < n; i++) out[i] = out[i] * inv / divisor;
}

/* One token t through head h's state s [dk, dv]; scratch: 5 * max(dk, dv) floats. */
static void delta_token(const Delta *d, int64_t t, int64_t h, float *s, float *scratch) {
    const int64_t dk = d->dk, dv = d->dv, hk = h / (d->num_v_heads / d->num_k_heads);
    const int64_t width = 2 * d->num_k_heads * dk + d->num_v_heads * dv;
    const float *row = d->conv + t * width;
    float *q = scratch, *k = q + dk, *v = k + dk, *acc = v + dv, *o = acc + dv;
    activate(row + hk * dk, dk, d->bf16, 1, sqrtf((float)dk), q);
    activate(row + (d->num_k_heads + hk) * dk, dk, d->bf16, 1, 1.0f, k);
    activate(row + 2 * d->num_k_heads * dk + h * dv, dv, d->bf16, 0, 1.0f, v);
    const int64_t ab = t * d->num_v_heads + h;
    const float beta = rnd(d->bf16, 1.0f / (1.0f + vector_expf(-d->b[ab])));
    const float x = d->a[ab] + d->dt_bias[h];
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(d->neg_a[h] * softplus);
    for (int64_t j = 0; j < dv; j++) acc[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        float *si = s + i * dv;
        const float ki = k[i];
        for (int64_t j = 0; j < dv; j++) {
            si[j] = si[j] * decay;
            acc[j] = acc[j] + si[j] * ki;
        }
    }
    for (int64_t j = 0; j < dv; j++) {
        acc[j] = (v[j] - acc[j]) * beta;
        o[j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; i++) {
        float *si = s + i * dv;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < dv; j++) {
            si[j] = si[j] + ki * acc[j];
            o[j] = o[j] + si[j] * qi;
        }
    }
    for (int64_t j = 0; j < dv; j++) o[j] = rnd(d->bf16, o[j]);
    const float inv = 1.0f / sqrtf(fixed_sum_of_products(o, o, dv) / (float)dv + d->eps);
    const float *z = d->z + t * d->num_v_heads * dv + h * dv;
    float *out = d->out + t * d->num_v_heads * dv + h * dv;
    for (int64_t j = 0; j < dv; j++) {
        const float normed = rnd(d->bf16, rnd(d->bf16, o[j] * inv) * d->norm_weight[j]);
        out[j] = rnd(d->bf16, normed * silu(z[j]));
    }
}

static void delta_step(const void *d, int64_t t, int64_t h, float *s, float *scratch) {
    delta_token(d, t, h, s, scratch);
}

int gated_delta_rule_f32(const float *conv, const float *z, const float *b, const float *a,
                         const float *neg_a, const float *dt_bias, const float *norm_weight,
                         const int64_t *spans, int64_t num_seqs, const int64_t *saves,
                         int64_t num_saves, float *cache, int64_t cache_rows,
                         int64_t cache_stride, float *kept, int64_t kept_rows,
                         int64_t kept_stride, int64_t num_k_heads, int64_t num_v_heads,
                         int64_t key_head_dim, int64_t value_head_dim, float eps, int bf16,
                         float *out) {
    if (num_k_heads <= 0 || num_v_heads % num_k_heads != 0 || key_head_dim <= 0 ||
        value_head_dim <= 0)
        return -1;
    const int64_t head_numel = key_head_dim * value_head_dim;
    const RecurrentRows rows = {spans, num_seqs, saves, num_saves, cache, cache_rows,
                                cache_stride, kept, kept_rows, kept_stride,
                                num_v_heads * head_numel};
    const Delta d = {conv, z, b, a, neg_a, dt_bias, norm_weight, num_k_heads, num_v_heads,
                     key_head_dim, value_head_dim, eps, bf16, out};
    const int64_t widest = key_head_dim > value_head_dim ? key_head_dim : value_head_dim;
    return recurrent_walk(&rows, num_v_heads, head_numel, 5 * widest, delta_step, &d);
}
