/* The per-row steps of the AMX-BF16 attention kernels (prefill_attention_amx.c's
 * description; decode_attention_amx.c runs the same steps over the paged
 * cache): every step reads and writes one query row's state alone, so a
 * row's bits depend only on its q, its position and the keys, whichever
 * kernel, chunk or step it ran in. Include it only where the compiler
 * targets AMX-BF16 and AVX512-BF16 (the including file's guard). */
#ifndef SLUICE_AMX_ATTENTION_H
#define SLUICE_AMX_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include "vector_exp.h"

#define BLOCK 64 /* keys per block: 4 score tiles, 2 P.V steps (128 measured no faster) */
#define VECS (BLOCK / 16) /* vectors of 16 scores a row */
#define ROWS 16  /* queries per row tile */

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* Where one KV head's keys and values are: key i's row at k + kv_offset(s, k_stride, i)
 * (a paged cache: `table` names the block of each block_size keys; contiguous rows:
 * a table of one block 0 with block_size num_keys). */
struct kv_rows {
    const uint16_t *k, *v;
    const int64_t *table;
    int64_t block_size, k_stride, v_stride, num_keys;
};

static inline int64_t kv_offset(const struct kv_rows *s, int64_t stride, int64_t i) {
    return (s->table[i / s->block_size] * s->block_size + i % s->block_size) * stride;
}

/* Block b's values of one KV head as B tiles of P.V (weigh_values'
 * layout), zero past num_keys. */
static void pack_values(const struct kv_rows *s, int64_t hd, int64_t b, uint32_t *vp) {
    const int64_t chunks = hd / 16, first = b * BLOCK;
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t pair = 0; pair < BLOCK / 2; pair++) {
        const int64_t key = first + 2 * pair;
        const uint16_t *even = key < s->num_keys ? s->v + kv_offset(s, s->v_stride, key) : NULL;
        const uint16_t *odd =
            key + 1 < s->num_keys ? s->v + kv_offset(s, s->v_stride, key + 1) : NULL;
        uint32_t *step = vp + (pair / 16) * chunks * 256 + (pair % 16) * 16;
        for (int64_t c = 0; c < chunks; c += 2) { /* 32 dims: two chunks (value_dim) */
            const __m512i e = even ? _mm512_loadu_si512(even + 16 * c) : zero;
            const __m512i o = odd ? _mm512_loadu_si512(odd + 16 * c) : zero;
            _mm512_storeu_si512(step + c * 256, _mm512_unpacklo_epi16(e, o));
            _mm512_storeu_si512(step + (c + 1) * 256, _mm512_unpackhi_epi16(e, o));
        }
    }
}

/* The dimension of output column j (0..15) of chunk c in pack_values' order:
 * unpacking two keys' 32 dims interleaves them within 128-bit lanes, so
 * chunk 2h holds dims 32h + {0-3, 8-11, 16-19, 24-27} and chunk 2h + 1 the
 * other four of each 8. Each column's sum is the same; only its place moves. */
static inline int64_t value_dim(int64_t c, int64_t j) {
    return 32 * (c / 2) + 8 * (j / 4) + j % 4 + 4 * (c % 2);
}

/* A thread's scratch: the task's queries, its rows' state, one tile's products. */
struct scratch {
    uint16_t *q;    /* [tiles][16][head_dim], zero past the last query */
    float *o;       /* [tiles][16][head_dim] unnormalised outputs */
    float *sums;    /* [tiles][16][16] softmax denominators, 16 lanes per row */
    float *top;     /* [tiles][16] running maxima (scaled scores) */
    float *scores;  /* [16][BLOCK] */
    uint16_t *p;    /* [16][BLOCK] probabilities, bfloat16 */
    float *factor;  /* [16] what each row's earlier sums are multiplied by */
};

/* Step 1: scores of a row tile's queries against the block's keys, 64 at a time. */
static inline void score_tile(const uint16_t *q, const uint32_t *kp, int64_t head_dim,
                              float *scores) {
    const int64_t tile_words = head_dim / 2 * 16; /* one 16-key tile of packed keys */
    for (int64_t keys = 0; keys < BLOCK; keys += 64, kp += 4 * tile_words, scores += 64) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < head_dim / 32; s++) {
            const uint32_t *ks = kp + s * 256;
            _tile_loadd(4, q + 32 * s, head_dim * 2);
            _tile_loadd(5, ks, 64);
            _tile_loadd(6, ks + tile_words, 64);
            _tile_loadd(7, ks + 2 * tile_words, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, ks + 3 * tile_words, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, scores, BLOCK * 4);
        _tile_stored(1, scores + 16, BLOCK * 4);
        _tile_stored(2, scores + 32, BLOCK * 4);
        _tile_stored(3, scores + 48, BLOCK * 4);
    }
}

/* Step 2a for one row: the maximum of its scaled scores, 16 lanes to
 * reduce; keys past `limit` (its last visible key, block-relative) are set
 * to -inf in place first. A block it sees whole takes no mask: the values
 * are the same either way. All -inf where it sees no key of the block. */
static inline __m512 row_max(float *scores, int64_t limit, float scale) {
    if (limit < 0) return _mm512_set1_ps(-INFINITY);
    __m512 s[VECS];
    for (int j = 0; j < VECS; j++) s[j] = _mm512_loadu_ps(scores + 16 * j);
    if (limit < BLOCK - 1) {
        const __m512i lane =
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i limits = _mm512_set1_epi32((int32_t)limit);
        for (int j = 0; j < VECS; j++) {
            const __mmask16 visible = _mm512_cmple_epi32_mask(
                _mm512_add_epi32(lane, _mm512_set1_epi32(16 * j)), limits);
            s[j] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), visible, s[j]);
            _mm512_storeu_ps(scores + 16 * j, s[j]);
        }
    }
    const __m512 scales = _mm512_set1_ps(scale);
    for (int j = 0; j < VECS; j++) s[j] = _mm512_mul_ps(s[j], scales);
    for (int width = VECS / 2; width > 0; width /= 2) /* a tree of maxima */
        for (int j = 0; j < width; j++) s[j] = _mm512_max_ps(s[j], s[j + width]);
    return s[0];
}

/* Lanes j with bit k set: b's maxima over lanes j and j ^ k; the others a's. */
static inline __m512 fold(__m512 a, __m512 b, int k, __mmask16 upper) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i partner = _mm512_xor_si512(lane, _mm512_set1_epi32(k));
    const __m512 a_swapped = _mm512_permutexvar_ps(partner, a);
    const __m512 b_swapped = _mm512_permutexvar_ps(partner, b);
    return _mm512_max_ps(_mm512_mask_blend_ps(upper, a, b_swapped),
                         _mm512_mask_blend_ps(upper, a_swapped, b));
}

/* Step 2b: lane r = the maximum of v[r]'s 16 lanes (a transposing reduction:
 * 15 folds for 16 rows instead of a horizontal reduction each). */
static inline __m512 max_per_row(__m512 v[ROWS]) {
    for (int i = 0; i < 8; i++) v[i] = fold(v[i], v[i + 8], 8, 0xff00);
    for (int i = 0; i < 4; i++) v[i] = fold(v[i], v[i + 4], 4, 0xf0f0);
    for (int i = 0; i < 2; i++) v[i] = fold(v[i], v[i + 2], 2, 0xcccc);
    return fold(v[0], v[1], 1, 0xaaaa);
}

/* Step 2c, 16 rows at once: new maxima and the factors of their earlier
 * sums (exactly 1 where the maximum stays, or the row sees nothing here);
 * returns the rows whose earlier outputs need the factor. */
static inline __mmask16 rescale_rows(float *top, __m512 seen, float *factor) {
    const __m512 old = _mm512_loadu_ps(top), new = _mm512_max_ps(old, seen);
    const __mmask16 moved = _mm512_cmp_ps_mask(new, old, _CMP_NEQ_UQ);
    const __m512 f = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), moved, exp16(_mm512_sub_ps(old, new)));
    _mm512_storeu_ps(top, new);
    _mm512_storeu_ps(factor, f); /* 0 for a row's first keys: its sums are 0 */
    return moved & _mm512_cmp_ps_mask(old, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
}

/* Step 2d for one row that sees a key of the block: its probabilities
 * exp(s * scale - top) (bfloat16, into p) and its sums. */
static inline void weigh_row(const float *scores, float scale, float top, float factor,
                             float *sums, uint16_t *p) {
    const __m512 scales = _mm512_set1_ps(scale), shift = _mm512_set1_ps(top);
    __m512 w[VECS], sum[VECS];
    for (int j = 0; j < VECS; j++)
        sum[j] = w[j] = exp16(_mm512_fmsub_ps(_mm512_loadu_ps(scores + 16 * j), scales, shift));
    for (int j = 0; j < VECS / 2; j++)
        _mm512_storeu_si512(p + 32 * j, (__m512i)_mm512_cvtne2ps_pbh(w[2 * j + 1], w[2 * j]));
    for (int width = VECS / 2; width > 0; width /= 2) /* a tree of sums */
        for (int j = 0; j < width; j++) sum[j] = _mm512_add_ps(sum[j], sum[j + width]);
    _mm512_storeu_ps(sums, _mm512_fmadd_ps(_mm512_loadu_ps(sums), _mm512_set1_ps(factor), sum[0]));
}

/* Step 3: o [16][head_dim] += P (16 x 64 keys) times the block's values,
 * accumulated in the C tiles (a row of P that is all zero adds zero). */
static inline void weigh_values(const uint16_t *p, const uint32_t *vp, int64_t head_dim,
                                float *o) {
    const int64_t chunks = head_dim / 16, stride = head_dim * 4;
    for (int64_t c = 0; c < chunks; c += 4) {
        _tile_loadd(0, o + 16 * c, stride);
        _tile_loadd(1, o + 16 * c + 16, stride);
        _tile_loadd(2, o + 16 * c + 32, stride);
        _tile_loadd(3, o + 16 * c + 48, stride);
        for (int64_t s = 0; s < BLOCK / 32; s++) {
            const uint32_t *vs = vp + (s * chunks + c) * 256;
            _tile_loadd(4, p + 32 * s, BLOCK * 2);
            _tile_loadd(5, vs, 64);
            _tile_loadd(6, vs + 256, 64);
            _tile_loadd(7, vs + 512, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, vs + 768, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, o + 16 * c, stride);
        _tile_stored(1, o + 16 * c + 16, stride);
        _tile_stored(2, o + 16 * c + 32, stride);
        _tile_stored(3, o + 16 * c + 48, stride);
    }
}

/* Steps 2 and 3 for row tile t (its 16 rows' state at t * ROWS) and one
 * block whose scores are in w->scores: limits[r] is row r's last visible
 * key, relative to the block (below 0: it sees none of it). */
static void finish_block(struct scratch *w, int64_t t, const int64_t limits[ROWS], float scale,
                         int64_t hd, const uint32_t *vp_block) {
    float *scores = w->scores;
    __m512 maxima[ROWS];
    for (int64_t r = 0; r < ROWS; r++) maxima[r] = row_max(scores + r * BLOCK, limits[r], scale);
    const __m512 seen = max_per_row(maxima);
    const __mmask16 unseen = _mm512_cmp_ps_mask(seen, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    float *top = w->top + t * ROWS, *o = w->o + t * ROWS * hd;
    const __mmask16 moved = rescale_rows(top, seen, w->factor);
    for (int64_t r = 0; r < ROWS; r++) {
        if (unseen & (1u << r)) { /* this block leaves the row as it was */
            memset(w->p + r * BLOCK, 0, BLOCK * 2);
            continue;
        }
        weigh_row(scores + r * BLOCK, scale, top[r], w->factor[r], w->sums + (t * ROWS + r) * 16,
                  w->p + r * BLOCK);
        if (moved & (1u << r)) {
            const __m512 factor = _mm512_set1_ps(w->factor[r]);
            for (int64_t d = 0; d < hd; d += 16)
                _mm512_storeu_ps(o + r * hd + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * hd + d),
                                                               factor));
        }
    }
    weigh_values(w->p, vp_block, hd, o);
}

/* Row i of the state (tile t = i / ROWS): its output, o over its sums, in bfloat16. */
static inline void store_row(const struct scratch *w, int64_t i, int64_t hd, uint16_t *dst) {
    const float total = _mm512_reduce_add_ps(_mm512_loadu_ps(w->sums + i * 16));
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    uint16_t rounded[16];
    for (int64_t c = 0; c < hd / 16; c++) {
        _mm256_storeu_si256((__m256i *)rounded,
                            (__m256i)_mm512_cvtneps_pbh(
                                _mm512_mul_ps(_mm512_loadu_ps(w->o + i * hd + 16 * c), inv)));
        for (int64_t j = 0; j < 16; j++) dst[value_dim(c, j)] = rounded[j];
    }
}

/* A thread's scratch for `tiles` row tiles carved from `base` (64-byte
 * aligned parts; base NULL: only the size); *bytes: its size. */
static struct scratch carve(char *base, int64_t tiles, int64_t hd, int64_t *bytes) {
    struct scratch w;
    int64_t at = 0;
#define TAKE(field, type, count)                      \
    w.field = base == NULL ? NULL : (type *)(base + at); \
    at += ((int64_t)sizeof(type) * (count) + 63) / 64 * 64;
    TAKE(q, uint16_t, tiles * ROWS * hd)
    TAKE(o, float, tiles * ROWS * hd)
    TAKE(sums, float, tiles * ROWS * 16)
    TAKE(top, float, tiles * ROWS)
    TAKE(scores, float, ROWS * BLOCK)
    TAKE(p, uint16_t, ROWS * BLOCK)
    TAKE(factor, float, ROWS)
#undef TAKE
    *bytes = at;
    return w;
}

#endif
