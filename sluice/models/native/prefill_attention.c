/* Causal attention of a prefill chunk, bfloat16, with AVX512-BF16: query i
 * (at position offset + i of its sequence) attends to keys 0..offset + i.
 * The chunk's own keys are the last num_queries of the num_keys given, so
 * one call covers a whole prompt (offset 0) and a chunk behind cached
 * context alike, and no tile of keys that every query of a block masks is
 * computed.
 *
 * Flash attention's scheme: per (query head, block of 8 queries), key tiles
 * of 16 in order, an online softmax (running maximum and sum per query),
 * float32 accumulators. Both products run on vdpbf16ps, which multiplies
 * pairs of bfloat16 into float32 sums:
 *   - scores: lanes are 16 keys, pairs are 2 dimensions; keys are packed
 *     once per call into [tile][dim pair][16 keys] so a tile's pair is one
 *     load, and each query's dimension pair is a broadcast;
 *   - weighted values: lanes are 16 dimensions, pairs are 2 keys; values are
 *     packed into [tile][key pair][dim chunk][16 dims], and the
 *     probabilities are rounded to bfloat16 for it (as bfloat16 flash
 *     kernels do; their float32 sum, the denominator, is not rounded).
 * torch's CPU flash kernel ran at about 100 GFLOPS on the embedded model's
 * heads (64 dimensions), a quarter of its bfloat16 matmuls' rate, and was
 * about half of a 2,000-token prompt's prefill.
 *
 * Layouts: q [num_queries, num_heads, head_dim] with q_stride elements
 * between tokens; k and v [num_keys, num_kv_heads, head_dim] with k_stride
 * and v_stride between tokens; out [num_queries, num_heads, head_dim] contiguous. Heads
 * and dimensions contiguous; head_dim 64 or 128; query head h reads KV head
 * h / (num_heads / num_kv_heads).
 *
 * Returns 0; -1 (nothing written) for an unsupported shape or no memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "sluice_abi.h"
#include "bf16.h"
#include "vector_exp.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define KEYS 16 /* keys per tile: one zmm of float32 scores */
#define ROWS 8  /* queries per block */

int prefill_attention_available(void) { return 1; }

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* One KV head's keys and values into the two packed layouts (zero past num_keys). */
static void pack_head(const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                      int64_t num_keys, int64_t head_dim, uint32_t *kp, uint32_t *vp) {
    const int64_t tiles = (num_keys + 2 * KEYS - 1) / (2 * KEYS) * 2, dim_pairs = head_dim / 2;
    const int64_t chunks = head_dim / 16;
    for (int64_t t = 0; t < tiles; t++) {
        uint32_t *kt = kp + t * dim_pairs * KEYS;
        uint32_t *vt = vp + t * (KEYS / 2) * chunks * 16;
        for (int64_t j = 0; j < KEYS; j++) {
            const int64_t key = t * KEYS + j;
            const uint16_t *row = key < num_keys ? k + key * k_stride : NULL;
            for (int64_t p = 0; p < dim_pairs; p++)
                kt[p * KEYS + j] = row ? pair_of(row[2 * p], row[2 * p + 1]) : 0;
        }
        for (int64_t pair = 0; pair < KEYS / 2; pair++) {
            const int64_t key = t * KEYS + 2 * pair;
            const uint16_t *even = key < num_keys ? v + key * v_stride : NULL;
            const uint16_t *odd = key + 1 < num_keys ? v + (key + 1) * v_stride : NULL;
            for (int64_t d = 0; d < head_dim; d++)
                vt[(pair * chunks + d / 16) * 16 + d % 16] =
                    pair_of(even ? even[d] : 0, odd ? odd[d] : 0);
        }
    }
}

/* One block of `rows` (<= ROWS) queries of one head, keys two tiles (32) at
 * a time: each query's dimension pair, broadcast once, multiplies both
 * tiles' keys (16 independent vdpbf16ps chains, half a broadcast per
 * product). head_dim is a constant in each caller below, so the loops over
 * it unroll. The packed keys and values extend to an even number of tiles. */
static inline __attribute__((always_inline)) void attend_block(
    const uint16_t *q, int64_t q_stride, const uint32_t *kp, const uint32_t *vp, int64_t first,
    int64_t rows, int64_t offset, int64_t num_keys, const int64_t head_dim, float scale,
    uint16_t *out, int64_t out_stride) {
    const int64_t dim_pairs = head_dim / 2, chunks = head_dim / 16;
    const int64_t tile_words = dim_pairs * KEYS; /* one tile of packed K or V */
    __m512 o[ROWS][128 / 16];
    float top[ROWS], total[ROWS];
    const uint16_t *qrow[ROWS];
    for (int64_t r = 0; r < ROWS; r++) {
        qrow[r] = q + (first + (r < rows ? r : rows - 1)) * q_stride;
        top[r] = -INFINITY;
        total[r] = 0.0f;
        for (int64_t c = 0; c < chunks; c++) o[r][c] = _mm512_setzero_ps();
    }
    const int64_t last_visible = offset + first + rows - 1; /* the block's last query sees up to here */
    const int64_t end = last_visible + 1 < num_keys ? last_visible + 1 : num_keys;
    const int64_t steps = (end + 2 * KEYS - 1) / (2 * KEYS);
    const __m512 scales = _mm512_set1_ps(scale);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t step = 0; step < steps; step++) {
        const uint32_t *k0 = kp + 2 * step * tile_words, *k1 = k0 + tile_words;
        __m512 s0[ROWS], s1[ROWS];
        for (int64_t r = 0; r < ROWS; r++) s0[r] = s1[r] = _mm512_setzero_ps();
        for (int64_t p = 0; p < dim_pairs; p++) {
            const __m512bh keys0 = (__m512bh)_mm512_loadu_si512(k0 + p * KEYS);
            const __m512bh keys1 = (__m512bh)_mm512_loadu_si512(k1 + p * KEYS);
            for (int64_t r = 0; r < ROWS; r++) {
                const __m512bh two = (__m512bh)_mm512_castps_si512(
                    _mm512_broadcastss_ps(_mm_load_ss((const float *)(qrow[r] + 2 * p))));
                s0[r] = _mm512_dpbf16_ps(s0[r], two, keys0);
                s1[r] = _mm512_dpbf16_ps(s1[r], two, keys1);
            }
        }
        const uint32_t *v0 = vp + 2 * step * tile_words;
        const __m512i index0 = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)(2 * step * KEYS)));
        const __m512i index1 = _mm512_add_epi32(index0, _mm512_set1_epi32(KEYS));
        for (int64_t r = 0; r < rows; r++) {
            /* Keys after this query's position (or past the last key) are masked. */
            const int64_t limit = offset + first + r < num_keys - 1 ? offset + first + r : num_keys - 1;
            const __m512i limits = _mm512_set1_epi32((int32_t)limit);
            const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
            const __m512 x0 = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(index0, limits),
                                                 _mm512_mul_ps(s0[r], scales));
            const __m512 x1 = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(index1, limits),
                                                 _mm512_mul_ps(s1[r], scales));
            const float seen = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
            const float new_top = seen > top[r] ? seen : top[r];
            if (new_top == -INFINITY) continue; /* nothing visible yet */
            const __m512 shift = _mm512_set1_ps(new_top);
            /* exp(old - new) for every lane (0 when there was no old maximum). */
            const __m512 factor = exp16(_mm512_set1_ps(top[r] - new_top));
            const __m512 w0 = exp16(_mm512_sub_ps(x0, shift)), w1 = exp16(_mm512_sub_ps(x1, shift));
            total[r] = total[r] * _mm512_cvtss_f32(factor) + _mm512_reduce_add_ps(_mm512_add_ps(w0, w1));
            top[r] = new_top;
            uint32_t pairs[KEYS];
            _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
            __m512 acc[128 / 16], acc_odd[128 / 16]; /* even and odd key pairs */
            for (int64_t c = 0; c < chunks; c++) {
                acc[c] = _mm512_mul_ps(o[r][c], factor);
                acc_odd[c] = _mm512_setzero_ps();
            }
            for (int64_t pair = 0; pair < KEYS; pair += 2) {
                const __m512bh weight = (__m512bh)_mm512_set1_epi32((int32_t)pairs[pair]);
                const __m512bh weight_odd = (__m512bh)_mm512_set1_epi32((int32_t)pairs[pair + 1]);
                for (int64_t c = 0; c < chunks; c++) {
                    acc[c] = _mm512_dpbf16_ps(
                        acc[c], weight, (__m512bh)_mm512_loadu_si512(v0 + (pair * chunks + c) * 16));
                    acc_odd[c] = _mm512_dpbf16_ps(
                        acc_odd[c], weight_odd,
                        (__m512bh)_mm512_loadu_si512(v0 + ((pair + 1) * chunks + c) * 16));
                }
            }
            for (int64_t c = 0; c < chunks; c++) o[r][c] = _mm512_add_ps(acc[c], acc_odd[c]);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / total[r]);
        float row[128];
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(row + 16 * c, _mm512_mul_ps(o[r][c], inv));
        uint16_t *dst = out + (first + r) * out_stride;
        for (int64_t d = 0; d < head_dim; d++) bf16_store(dst + d, row[d]);
    }
}

int prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                           int64_t k_stride, const uint16_t *v, int64_t v_stride,
                           int64_t num_queries,
                           int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, float scale, uint16_t *out) {
    if ((head_dim != 64 && head_dim != 128) || num_kv_heads <= 0 || num_heads % num_kv_heads ||
        num_queries < 1 || num_keys < num_queries)
        return -1;
    const int64_t offset = num_keys - num_queries, group = num_heads / num_kv_heads;
    const int64_t tiles = (num_keys + 2 * KEYS - 1) / (2 * KEYS) * 2; /* even: keys go 32 at a time */
    const int64_t head_words = tiles * KEYS * head_dim / 2; /* uint32 pairs per head, K or V */
    uint32_t *kp = malloc(sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    uint32_t *vp = malloc(sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    if (kp == NULL || vp == NULL) {
        free(kp);
        free(vp);
        return -1;
    }
    const int64_t blocks = (num_queries + ROWS - 1) / ROWS;
    const int64_t out_stride = num_heads * head_dim;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t h = 0; h < num_kv_heads; h++)
            pack_head(k + h * head_dim, k_stride, v + h * head_dim, v_stride, num_keys, head_dim,
                      kp + h * head_words, vp + h * head_words);
        /* Later blocks see more keys: hand them out first, one at a time. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < blocks * num_heads; task++) {
            const int64_t block = blocks - 1 - task / num_heads, h = task % num_heads;
            const int64_t first = block * ROWS;
            const int64_t rows = num_queries - first < ROWS ? num_queries - first : ROWS;
            const int64_t kv = h / group;
            if (head_dim == 64)
                attend_block(q + h * 64, q_stride, kp + kv * head_words, vp + kv * head_words,
                             first, rows, offset, num_keys, 64, scale, out + h * 64, out_stride);
            else
                attend_block(q + h * 128, q_stride, kp + kv * head_words, vp + kv * head_words,
                             first, rows, offset, num_keys, 128, scale, out + h * 128,
                             out_stride);
        }
    }
    free(kp);
    free(vp);
    return 0;
}

#else /* no AVX512-BF16: the caller keeps torch's flash attention */

int prefill_attention_available(void) { return 0; }
int prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                           int64_t k_stride, const uint16_t *v, int64_t v_stride,
                           int64_t num_queries,
                           int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, float scale, uint16_t *out) {
    (void)q; (void)q_stride; (void)k; (void)k_stride; (void)v; (void)v_stride;
    (void)num_queries;
    (void)num_keys; (void)num_heads; (void)num_kv_heads; (void)head_dim; (void)scale; (void)out;
    return -1;
}

#endif
