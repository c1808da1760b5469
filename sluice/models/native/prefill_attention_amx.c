/* prefill_attention.c's causal prefill attention (same arguments, layouts,
 * causal rule, grouped-query mapping and return codes) with both products
 * on AMX-BF16 tiles (TDPBF16PS): flash attention, an online softmax on
 * AVX-512 (vector_exp.h), float32 accumulators, the probabilities rounded
 * to bfloat16 for P.V (their float32 sum, the denominator, is not).
 *
 * Chunk invariance: key blocks of BLOCK (64) keys sit at fixed absolute
 * positions (block b holds keys [64 b, 64 b + 64)), every row visits them
 * in ascending order, keys after its own position are masked, and a block
 * in which a row sees no key leaves that row's state untouched. Every
 * operation on a row reads only that row (a tile product's row depends on
 * its A row alone). So a query's result depends only on its own q and the
 * keys it sees: not on how the prompt was cut into chunks, nor on which
 * queries share its block (tests/test_native_prefill_attention_amx.py
 * checks it bit for bit).
 *
 * Work: a task is the 16 * tiles_per_head queries of every query head of
 * one KV head (its group; at least TASK_TILES row tiles of 16 queries), so
 * each block's packed keys and values, read once from L2, serve them all
 * from L1. Per block and row tile (an item; tiles that see no key of the
 * block are skipped):
 *   1. scores S [16 x 64]: C tiles 0-3 (one per 16 keys) += A (16 queries x
 *      32 dims, tile 4) x B (16 dim pairs x 16 keys, tiles 5-7), head_dim/32
 *      steps; stored to memory;
 *   2. softmax on AVX-512: row by row the scores masked (in place, on the
 *      diagonal blocks only) and scaled, 16 lanes of maxima; one
 *      transposing reduction of the 16 rows' lanes, and for the 16 rows at
 *      once the new maxima and rescale factors; row by row
 *      exp(s * scale - max), sums, P [16 x 64] rounded to bfloat16; the
 *      outputs of rows whose maximum moved multiplied by their factor
 *      (exactly 1 for the others, so they are left alone);
 *   3. P.V: per 64 dims, the outputs loaded into C tiles 0-3, += A (P, 16 x
 *      32 keys) x B (16 key pairs x 16 dims) twice, stored back.
 * Keys are packed once per call per KV head as [16 keys][dim pair][16
 * keys] (B of step 1), values as [32 keys][dim chunk][key pair][16 dims]
 * (B of step 3), both zero past num_keys up to a whole block.
 *
 * Speed (2-core Sapphire Rapids VM, 9/3 heads of 64, contended; the
 * prefill rows of benchmarks/attention_kernels.py): 1.6-1.9x torch's flash
 * SDPA (oneDNN, also on AMX) from 2,000 to 8,000 keys, 2.3x at 512. One thread at 4,000 keys (before the one reduction of maxima):
 * the tile products alone took 18 ms, the softmax alone 24, both 41: they
 * do not overlap. Issuing the next
 * item's scores and the previous item's P.V in steps between the
 * softmax's rows (software pipelining) was slower; 3 or 16 row tiles a
 * task instead of 8, or blocks of 128 keys, no faster. The softmax's exp
 * (vector_exp.h, 16 instructions per 16 scores) is most of it.
 *
 * Returns 0; -1 (nothing written) for an unsupported shape or no memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_exp.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#include <omp.h>

#include "amx_tiles.h"

#define BLOCK 64 /* keys per block: 4 score tiles, 2 P.V steps (128 measured no faster) */
#define VECS (BLOCK / 16) /* vectors of 16 scores a row */
#define ROWS 16  /* queries per row tile */
#define TASK_TILES 8 /* row tiles a task, at least */

static int amx_permission = 0;

int prefill_attention_amx_available(void) { return amx_tiles_granted(&amx_permission); }

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* One block of one KV head's keys and values into their packed layouts. */
static void pack_block(const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                       int64_t num_keys, int64_t head_dim, int64_t block, uint32_t *kp,
                       uint32_t *vp) {
    const int64_t dim_pairs = head_dim / 2, chunks = head_dim / 16, first = block * BLOCK;
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int32_t)(k_stride * 2))); /* 16 keys' byte offsets */
    for (int64_t j = 0; j < BLOCK; j += 16) {
        uint32_t *tile = kp + (j / 16) * dim_pairs * 16;
        if (first + j + 16 <= num_keys) { /* 16 keys: each dimension pair a gather */
            const char *base = (const char *)(k + (first + j) * k_stride);
            for (int64_t p = 0; p < dim_pairs; p++)
                _mm512_storeu_si512(tile + p * 16, _mm512_i32gather_epi32(rows, base + 4 * p, 1));
            continue;
        }
        for (int64_t i = 0; i < 16; i++) {
            const int64_t key = first + j + i;
            const uint16_t *row = key < num_keys ? k + key * k_stride : NULL;
            for (int64_t p = 0; p < dim_pairs; p++)
                tile[p * 16 + i] = row ? pair_of(row[2 * p], row[2 * p + 1]) : 0;
        }
    }
    for (int64_t pair = 0; pair < BLOCK / 2; pair++) {
        const int64_t key = first + 2 * pair;
        const uint16_t *even = key < num_keys ? v + key * v_stride : NULL;
        const uint16_t *odd = key + 1 < num_keys ? v + (key + 1) * v_stride : NULL;
        uint32_t *step = vp + (pair / 16) * chunks * 256 + (pair % 16) * 16;
        for (int64_t c = 0; c < chunks; c++) { /* 16 dims: both keys' values side by side */
            const __m256i zero = _mm256_setzero_si256();
            const __m256i lo = even ? _mm256_loadu_si256((const __m256i *)(even + 16 * c)) : zero;
            const __m256i hi = odd ? _mm256_loadu_si256((const __m256i *)(odd + 16 * c)) : zero;
            _mm512_storeu_si512(step + c * 256,
                                _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                                _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
        }
    }
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

/* One call's shared arguments. */
struct call {
    const uint16_t *q;
    const uint32_t *kp, *vp; /* per KV head: head_words apart */
    uint16_t *out;
    int64_t q_stride, num_queries, num_keys, offset, num_heads, group, head_dim, head_words;
    int64_t tiles_per_head; /* row tiles of one head in a task */
    float scale;
};

/* A task: rows [first, first + rows) of the group of KV head kv. */
struct task {
    int64_t first, rows, kv, tiles, blocks;
};

/* The position of the last valid row of row tile t (-1: the tile is empty). */
static inline int64_t tile_last(const struct call *c, const struct task *k, int64_t t) {
    const int64_t tile_first = (t % c->tiles_per_head) * ROWS;
    const int64_t valid = k->rows - tile_first < ROWS ? k->rows - tile_first : ROWS;
    return valid <= 0 ? -1 : c->offset + k->first + tile_first + valid - 1;
}

/* The work item after (b, t), block-major: a row tile that sees a key of
 * the block. 0 when none is left. */
static inline int next_item(const struct call *c, const struct task *k, int64_t *b, int64_t *t) {
    for (;;) {
        if (++*t == k->tiles) {
            *t = 0;
            if (++*b == k->blocks) return 0;
        }
        if (tile_last(c, k, *t) >= *b * BLOCK) return 1;
    }
}

/* Steps 2 and 3 of item (b, t), whose scores are ready. */
static void finish_item(const struct call *c, const struct task *k, struct scratch *w,
                        int64_t b, int64_t t) {
    float *scores = w->scores;
    const int64_t hd = c->head_dim, tile_first = (t % c->tiles_per_head) * ROWS;
    __m512 maxima[ROWS];
    for (int64_t r = 0; r < ROWS; r++) {
        const int64_t position = c->offset + k->first + tile_first + r;
        int64_t limit = (position < c->num_keys - 1 ? position : c->num_keys - 1) - b * BLOCK;
        if (tile_first + r >= k->rows) limit = -1; /* past the last query */
        maxima[r] = row_max(scores + r * BLOCK, limit, c->scale);
    }
    const __m512 seen = max_per_row(maxima);
    const __mmask16 unseen = _mm512_cmp_ps_mask(seen, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    float *top = w->top + t * ROWS, *o = w->o + t * ROWS * hd;
    const __mmask16 moved = rescale_rows(top, seen, w->factor);
    for (int64_t r = 0; r < ROWS; r++) {
        if (unseen & (1u << r)) { /* this block leaves the row as it was */
            memset(w->p + r * BLOCK, 0, BLOCK * 2);
            continue;
        }
        weigh_row(scores + r * BLOCK, c->scale, top[r], w->factor[r],
                  w->sums + (t * ROWS + r) * 16, w->p + r * BLOCK);
        if (moved & (1u << r)) {
            const __m512 factor = _mm512_set1_ps(w->factor[r]);
            for (int64_t d = 0; d < hd; d += 16)
                _mm512_storeu_ps(o + r * hd + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * hd + d),
                                                               factor));
        }
    }
    weigh_values(w->p, c->vp + k->kv * c->head_words + b * BLOCK * hd / 2, hd, o);
}

/* The task's state before its first block: its queries, zero sums and outputs. */
static void start_task(const struct call *c, const struct task *k, struct scratch *w) {
    const int64_t hd = c->head_dim, task_rows = c->tiles_per_head * ROWS;
    memset(w->q, 0, (size_t)(k->tiles * ROWS * hd * 2));
    memset(w->o, 0, (size_t)(k->tiles * ROWS * hd * 4));
    memset(w->sums, 0, (size_t)(k->tiles * ROWS * 16 * 4));
    for (int64_t i = 0; i < k->tiles * ROWS; i++) w->top[i] = -INFINITY;
    for (int64_t g = 0; g < c->group; g++)
        for (int64_t r = 0; r < k->rows; r++)
            memcpy(w->q + (g * task_rows + r) * hd,
                   c->q + (k->first + r) * c->q_stride + (k->kv * c->group + g) * hd,
                   (size_t)(hd * 2));
}

/* The outputs of the task's rows: o over the sums, rounded to bfloat16. */
static void end_task(const struct call *c, const struct task *k, struct scratch *w) {
    const int64_t hd = c->head_dim, task_rows = c->tiles_per_head * ROWS;
    for (int64_t g = 0; g < c->group; g++)
        for (int64_t r = 0; r < k->rows; r++) {
            const int64_t i = g * task_rows + r;
            const float total = _mm512_reduce_add_ps(_mm512_loadu_ps(w->sums + i * 16));
            const __m512 inv = _mm512_set1_ps(1.0f / total);
            uint16_t *dst = c->out + ((k->first + r) * c->num_heads + k->kv * c->group + g) * hd;
            for (int64_t d = 0; d < hd; d += 16)
                _mm256_storeu_si256((__m256i *)(dst + d),
                                    (__m256i)_mm512_cvtneps_pbh(
                                        _mm512_mul_ps(_mm512_loadu_ps(w->o + i * hd + d), inv)));
        }
}

/* Every block of keys the task's rows see, then their outputs. */
static void run_task(const struct call *c, struct scratch *w, int64_t first, int64_t kv) {
    const int64_t hd = c->head_dim, task_rows = c->tiles_per_head * ROWS;
    struct task k = {.first = first, .kv = kv, .tiles = c->group * c->tiles_per_head};
    k.rows = c->num_queries - first < task_rows ? c->num_queries - first : task_rows;
    const int64_t last = c->offset + first + k.rows - 1; /* the task's last query's position */
    const int64_t end = last + 1 < c->num_keys ? last + 1 : c->num_keys;
    k.blocks = (end + BLOCK - 1) / BLOCK;
    start_task(c, &k, w);
    const uint32_t *kp = c->kp + kv * c->head_words;
    int64_t b = 0, t = 0; /* block 0 is seen by every row: item (0, 0) is the first */
    do {
        score_tile(w->q + t * ROWS * hd, kp + b * BLOCK * hd / 2, hd, w->scores);
        finish_item(c, &k, w, b, t);
    } while (next_item(c, &k, &b, &t));
    end_task(c, &k, w);
}

/* A thread's scratch carved from `base` (64-byte aligned parts); *bytes: its size. */
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

int prefill_attention_amx_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                               int64_t k_stride, const uint16_t *v, int64_t v_stride,
                               int64_t num_queries, int64_t num_keys, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, float scale,
                               uint16_t *out) {
    if ((head_dim != 64 && head_dim != 128) || num_kv_heads <= 0 || num_heads % num_kv_heads ||
        num_queries < 1 || num_keys < num_queries || !prefill_attention_amx_available())
        return -1;
    const int64_t group = num_heads / num_kv_heads, blocks = (num_keys + BLOCK - 1) / BLOCK;
    /* At least TASK_TILES row tiles per task: each block of keys, read
     * once from L2, serves them all from L1. */
    const int64_t tiles_per_head = group >= TASK_TILES ? 1 : (TASK_TILES + group - 1) / group;
    const int64_t head_words = blocks * BLOCK * head_dim / 2; /* uint32 pairs per head, K or V */
    const int64_t threads = omp_get_max_threads();
    int64_t per_thread;
    (void)carve(NULL, group * tiles_per_head, head_dim, &per_thread);
    uint32_t *kp = aligned_alloc(64, sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    uint32_t *vp = aligned_alloc(64, sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    char *scratch = aligned_alloc(64, (size_t)(per_thread * threads));
    if (kp == NULL || vp == NULL || scratch == NULL) {
        free(kp);
        free(vp);
        free(scratch);
        return -1;
    }
    const struct call c = {.q = q, .kp = kp, .vp = vp, .out = out, .q_stride = q_stride,
                           .num_queries = num_queries, .num_keys = num_keys,
                           .offset = num_keys - num_queries, .num_heads = num_heads,
                           .group = group, .head_dim = head_dim, .head_words = head_words,
                           .tiles_per_head = tiles_per_head, .scale = scale};
    const int64_t task_rows = tiles_per_head * ROWS;
    const int64_t row_blocks = (num_queries + task_rows - 1) / task_rows;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < num_kv_heads * blocks; item++) {
            const int64_t h = item / blocks, b = item % blocks;
            pack_block(k + h * head_dim, k_stride, v + h * head_dim, v_stride, num_keys, head_dim,
                       b, kp + h * head_words + b * BLOCK * head_dim / 2,
                       vp + h * head_words + b * BLOCK * head_dim / 2);
        }
        int64_t bytes;
        struct scratch w = carve(scratch + per_thread * omp_get_thread_num(),
                                 group * tiles_per_head, head_dim, &bytes);
        amx_configure_tiles();
        /* KV head by KV head, so the threads share one head's keys and
         * values in cache; later row blocks see more keys: first, one at a time. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < row_blocks * num_kv_heads; task++) {
            const int64_t block = row_blocks - 1 - task % row_blocks;
            run_task(&c, &w, block * task_rows, task / row_blocks);
        }
        _tile_release();
    }
    free(kp);
    free(vp);
    free(scratch);
    return 0;
}

#else /* no AMX-BF16 here: the plan keeps the other kernels */

int prefill_attention_amx_available(void) { return 0; }
int prefill_attention_amx_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                               int64_t k_stride, const uint16_t *v, int64_t v_stride,
                               int64_t num_queries, int64_t num_keys, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, float scale,
                               uint16_t *out) {
    (void)q; (void)q_stride; (void)k; (void)k_stride; (void)v; (void)v_stride;
    (void)num_queries; (void)num_keys; (void)num_heads; (void)num_kv_heads; (void)head_dim;
    (void)scale; (void)out;
    return -1;
}

#endif
