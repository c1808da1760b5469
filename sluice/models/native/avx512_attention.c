/* The per-row steps of the AVX512-BF16 attention kernels, compiled once for
 * prefill_attention.c and paged_decode_attention.c (the scheme: avx512_attention.h).
 *
 * A step's scores run on vdpbf16ps, which multiplies pairs of bfloat16 into
 * float32 sums: lanes are 16 keys, pairs are 2 dimensions, each row's
 * dimension pair a broadcast; the weighted values too: lanes are 16
 * dimensions, pairs are 2 keys, the probabilities rounded to bfloat16 for it
 * (as bfloat16 flash kernels do; their float32 sum, the denominator, is
 * not). Packing is a transpose of 16 x 16 words (keys) and an interleave of
 * two keys' rows (values), so a decode step can pack its keys as it reads
 * them from the paged cache, at about the cost of its dot products. */
#include <math.h>
#include <stdint.h>

#include "sluice_abi.h"
#include "bf16.h"
#include "vector_exp.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include "avx512_attention.h"

void avx_rows_start(struct avx_rows *s, int64_t rows, int64_t head_dim, const uint16_t *q0,
                    int64_t q_stride, int64_t limit0, int64_t limit_step) {
    s->rows = rows;
    s->head_dim = head_dim;
    for (int64_t r = 0; r < rows; r++) {
        s->q[r] = q0 + r * q_stride;
        s->limit[r] = limit0 + r * limit_step;
        s->top[r] = -INFINITY;
        s->total[r] = 0.0f;
        for (int64_t c = 0; c < AVX_MAX_DIM / 16; c++) s->o[r][c] = _mm512_setzero_ps();
    }
}

/* 16 rows of 16 words in place into 16 columns: r[i] word j becomes r[j] word i. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + k], lane L: rows 4g..4g+3 of word 4L + k */
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int k = 0; k < 4; k++) { /* a 4 x 4 transpose of 128-bit lanes */
        const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        const __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[k + 4] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[k + 8] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[k + 12] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

void avx_pack_step(const uint16_t *const *key_rows, const uint16_t *const *value_rows,
                   int64_t head_dim, uint32_t *kp, uint32_t *vp) {
    const int64_t dim_pairs = head_dim / 2, chunks = head_dim / 16;
    const __m512i zero = _mm512_setzero_si512();
    /* Keys: [tile][dim pair][16 keys], a 16 x 16 transpose per 16 dim pairs. */
    for (int64_t tile = 0; tile < 2; tile++)
        for (int64_t p0 = 0; p0 < dim_pairs; p0 += 16) {
            __m512i r[16];
            for (int64_t j = 0; j < 16; j++) {
                const uint16_t *row = key_rows[tile * AVX_TILE_KEYS + j];
                r[j] = row ? _mm512_loadu_si512(row + 2 * p0) : zero;
            }
            transpose16(r);
            uint32_t *dst = kp + tile * dim_pairs * AVX_TILE_KEYS + p0 * AVX_TILE_KEYS;
            for (int64_t i = 0; i < 16; i++) _mm512_storeu_si512(dst + i * AVX_TILE_KEYS, r[i]);
        }
    /* Values: [key pair][dim chunk][16 dims], each word (even key's, odd key's) of one dim. */
    const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                         40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                         32, 0);
    const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (int64_t pair = 0; pair < AVX_STEP_KEYS / 2; pair++) {
        const uint16_t *even = value_rows[2 * pair], *odd = value_rows[2 * pair + 1];
        uint32_t *dst = vp + pair * chunks * 16;
        for (int64_t c = 0; c < chunks; c += 2) { /* 32 dims: two chunks */
            const __m512i e = even ? _mm512_loadu_si512(even + 16 * c) : zero;
            const __m512i o = odd ? _mm512_loadu_si512(odd + 16 * c) : zero;
            _mm512_storeu_si512(dst + c * 16, _mm512_permutex2var_epi16(e, low, o));
            _mm512_storeu_si512(dst + (c + 1) * 16, _mm512_permutex2var_epi16(e, high, o));
        }
    }
}

/* One row's online-softmax update and weighted values for a step whose
 * scores (before scaling) are s0 (keys 32 step + 0..15) and s1 (16..31). */
static inline __attribute__((always_inline)) void update_row(
    struct avx_rows *s, int64_t r, __m512 s0, __m512 s1, const uint32_t *vp, int64_t step,
    const int64_t head_dim, float scale) {
    const int64_t chunks = head_dim / 16;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i index0 = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)(step * AVX_STEP_KEYS)));
    const __m512i index1 = _mm512_add_epi32(index0, _mm512_set1_epi32(AVX_TILE_KEYS));
    const __m512i limits = _mm512_set1_epi32((int32_t)s->limit[r]);
    const __m512 minus_inf = _mm512_set1_ps(-INFINITY), scales = _mm512_set1_ps(scale);
    /* Keys after this row's position (or past the sequence) are masked. */
    const __m512 x0 = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(index0, limits),
                                         _mm512_mul_ps(s0, scales));
    const __m512 x1 = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(index1, limits),
                                         _mm512_mul_ps(s1, scales));
    const float seen = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
    const float new_top = seen > s->top[r] ? seen : s->top[r];
    if (new_top == -INFINITY) return; /* nothing visible yet */
    const __m512 shift = _mm512_set1_ps(new_top);
    /* exp(old - new) for every lane (0 when there was no old maximum). */
    const __m512 factor = exp16(_mm512_set1_ps(s->top[r] - new_top));
    const __m512 w0 = exp16(_mm512_sub_ps(x0, shift)), w1 = exp16(_mm512_sub_ps(x1, shift));
    s->total[r] = s->total[r] * _mm512_cvtss_f32(factor) + _mm512_reduce_add_ps(_mm512_add_ps(w0, w1));
    s->top[r] = new_top;
    uint32_t pairs[AVX_STEP_KEYS / 2];
    _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
    __m512 acc[AVX_MAX_DIM / 16], acc_odd[AVX_MAX_DIM / 16]; /* even and odd key pairs */
    for (int64_t c = 0; c < chunks; c++) {
        acc[c] = _mm512_mul_ps(s->o[r][c], factor);
        acc_odd[c] = _mm512_setzero_ps();
    }
    for (int64_t pair = 0; pair < AVX_STEP_KEYS / 2; pair += 2) {
        const __m512bh weight = (__m512bh)_mm512_set1_epi32((int32_t)pairs[pair]);
        const __m512bh weight_odd = (__m512bh)_mm512_set1_epi32((int32_t)pairs[pair + 1]);
        for (int64_t c = 0; c < chunks; c++) {
            acc[c] = _mm512_dpbf16_ps(acc[c], weight,
                                      (__m512bh)_mm512_loadu_si512(vp + (pair * chunks + c) * 16));
            acc_odd[c] = _mm512_dpbf16_ps(
                acc_odd[c], weight_odd,
                (__m512bh)_mm512_loadu_si512(vp + ((pair + 1) * chunks + c) * 16));
        }
    }
    for (int64_t c = 0; c < chunks; c++) s->o[r][c] = _mm512_add_ps(acc[c], acc_odd[c]);
}

/* The step for `rows` rows (a constant in each instantiation below, so the
 * score chains stay in registers): each dimension pair of each row,
 * broadcast once, multiplies both tiles' keys; then each row that sees a
 * key of the step is updated. A row's chain of products is the same
 * whatever `rows` is. */
static inline __attribute__((always_inline)) void step_rows(
    struct avx_rows *s, const int64_t rows, const uint32_t *kp, const uint32_t *vp, int64_t step,
    const int64_t head_dim, float scale) {
    const int64_t dim_pairs = head_dim / 2, tile_words = dim_pairs * AVX_TILE_KEYS;
    const uint32_t *k0 = kp, *k1 = kp + tile_words;
    __m512 s0[AVX_ROWS], s1[AVX_ROWS];
    for (int64_t r = 0; r < rows; r++) s0[r] = s1[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < dim_pairs; p++) {
        const __m512bh keys0 = (__m512bh)_mm512_loadu_si512(k0 + p * AVX_TILE_KEYS);
        const __m512bh keys1 = (__m512bh)_mm512_loadu_si512(k1 + p * AVX_TILE_KEYS);
        for (int64_t r = 0; r < rows; r++) {
            const __m512bh two = (__m512bh)_mm512_castps_si512(
                _mm512_broadcastss_ps(_mm_load_ss((const float *)(s->q[r] + 2 * p))));
            s0[r] = _mm512_dpbf16_ps(s0[r], two, keys0);
            s1[r] = _mm512_dpbf16_ps(s1[r], two, keys1);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        if (step * AVX_STEP_KEYS <= s->limit[r]) /* else the row sees no key of this step */
            update_row(s, r, s0[r], s1[r], vp, step, head_dim, scale);
}

#define STEP_CASE(N)                                                                  \
    case N:                                                                           \
        if (s->head_dim == 64)                                                        \
            step_rows(s, N, kp, vp, step, 64, scale);                                 \
        else                                                                          \
            step_rows(s, N, kp, vp, step, 128, scale);                                \
        break;

void avx_rows_step(struct avx_rows *s, const uint32_t *kp, const uint32_t *vp, int64_t step,
                   float scale) {
    switch (s->rows) {
        STEP_CASE(1)
        STEP_CASE(2)
        STEP_CASE(3)
        STEP_CASE(4)
        STEP_CASE(5)
        STEP_CASE(6)
        STEP_CASE(7)
        STEP_CASE(8)
        default:
            break;
    }
}

void avx_rows_finish(const struct avx_rows *s, uint16_t *out0, int64_t out_stride) {
    const int64_t chunks = s->head_dim / 16;
    for (int64_t r = 0; r < s->rows; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / s->total[r]);
        float row[AVX_MAX_DIM];
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(row + 16 * c, _mm512_mul_ps(s->o[r][c], inv));
        uint16_t *dst = out0 + r * out_stride;
        for (int64_t d = 0; d < s->head_dim; d++) bf16_store(dst + d, row[d]);
    }
}

#else
typedef int avx512_attention_unused; /* no AVX512-BF16: the kernels that call these are stubs */
#endif
