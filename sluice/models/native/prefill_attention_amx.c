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
 * (B of step 3; the dims of a chunk in value_dim's order, amx_attention.h,
 * put back in place at the end), both zero past num_keys up to a whole block.
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

#include "sluice_abi.h"
#include "vector_exp.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#include <omp.h>

#include "amx_attention.h"
#include "amx_tiles.h"

#define TASK_TILES 8 /* row tiles a task, at least */

static int amx_permission = 0;

int prefill_attention_amx_available(void) { return amx_tiles_granted(&amx_permission); }


/* One block of one KV head's keys and values into their packed layouts,
 * zero past num_keys. */
static void pack_block(const struct kv_rows *s, int64_t head_dim, int64_t block, uint32_t *kp,
                       uint32_t *vp) {
    const int64_t dim_pairs = head_dim / 2, first = block * BLOCK;
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int32_t)(s->k_stride * 2))); /* 16 keys' byte offsets */
    for (int64_t j = 0; j < BLOCK; j += 16) {
        uint32_t *tile = kp + (j / 16) * dim_pairs * 16;
        const int64_t key0 = first + j;
        if (key0 + 16 <= s->num_keys && key0 / s->block_size == (key0 + 15) / s->block_size) {
            /* 16 keys of one block: each dimension pair a gather */
            const char *base = (const char *)(s->k + kv_offset(s, s->k_stride, key0));
            for (int64_t p = 0; p < dim_pairs; p++)
                _mm512_storeu_si512(tile + p * 16, _mm512_i32gather_epi32(rows, base + 4 * p, 1));
            continue;
        }
        for (int64_t i = 0; i < 16; i++) {
            const int64_t key = key0 + i;
            const uint16_t *row = key < s->num_keys ? s->k + kv_offset(s, s->k_stride, key) : NULL;
            for (int64_t p = 0; p < dim_pairs; p++)
                tile[p * 16 + i] = row ? pair_of(row[2 * p], row[2 * p + 1]) : 0;
        }
    }
    pack_values(s, head_dim, block, vp);
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
    const int64_t tile_first = (t % c->tiles_per_head) * ROWS;
    int64_t limits[ROWS];
    for (int64_t r = 0; r < ROWS; r++) {
        const int64_t position = c->offset + k->first + tile_first + r;
        limits[r] = (position < c->num_keys - 1 ? position : c->num_keys - 1) - b * BLOCK;
        if (tile_first + r >= k->rows) limits[r] = -1; /* past the last query */
    }
    finish_block(w, t, limits, c->scale, c->head_dim,
                 c->vp + k->kv * c->head_words + b * BLOCK * c->head_dim / 2);
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
        for (int64_t r = 0; r < k->rows; r++)
            store_row(w, g * task_rows + r, hd,
                      c->out + ((k->first + r) * c->num_heads + k->kv * c->group + g) * hd);
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
    static const int64_t contiguous[1] = {0}; /* every key in block 0 */
    const int64_t task_rows = tiles_per_head * ROWS;
    const int64_t row_blocks = (num_queries + task_rows - 1) / task_rows;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < num_kv_heads * blocks; item++) {
            const int64_t h = item / blocks, b = item % blocks;
            const struct kv_rows rows = {k + h * head_dim, v + h * head_dim, contiguous, num_keys,
                                         k_stride, v_stride, num_keys};
            pack_block(&rows, head_dim, b, kp + h * head_words + b * BLOCK * head_dim / 2,
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
