/* paged_decode_attention.c's decode attention (same arguments, layouts and
 * return codes) on AMX-BF16 tiles, by prefill_attention_amx.c's per-row
 * steps (amx_attention.h): a decode row of a sequence of L keys is the
 * query at position L - 1 of a prefill over those keys, so it gets exactly
 * the bits that query gets in any prefill chunk on that kernel. Decode
 * rows, the rows of a speculative verification and prompt chunks then all
 * agree, whichever of them computed a position.
 *
 * Keys need no packing: 16 keys of a cache block are the A tile of a score
 * tile as they lie (16 rows, the cache's token stride apart), the queries
 * its B tile, so the tile holds scores with keys down and queries across,
 * and each query's column is gathered into its row. Every score is the same
 * sum of the same products as prefill's (queries as A, packed keys as B),
 * bit for bit (tests/test_native_decode_attention_amx.py). Values are
 * packed per block of 64 keys, as prefill packs them.
 *
 * Rows that read one sequence's keys (a verification's 1 + k rows: each
 * row's table agrees with the next row's over its own keys, lengths not
 * decreasing) form a group: a row tile holds 16 of the group's queries (a
 * row's query heads of one KV head, row after row), and each block's packed
 * values serve them all. A row's result still depends only on its q and
 * the keys it sees, so it is the same alone as in any group.
 *
 * Work: a task is one KV head of one group (up to TASK_ROWS rows; longer
 * groups take several tasks), shared out over OpenMP threads; each thread
 * packs into its own scratch. Speed (2-core Sapphire Rapids VM, 9/3 heads
 * of 64, 1,300 keys, quiet): one row 31 us against the AVX512 kernel's 49,
 * 17 rows of one sequence 113 against 529; 64 sequences of 300 keys, even.
 *
 * Returns 0; -1 (nothing written) for an unsupported shape, a length or
 * block id out of range, or no memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"
#include "paged_tables.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#include <omp.h>

#include "amx_attention.h"
#include "amx_tiles.h"

/* Rows of one group a task takes at most. */
#define TASK_ROWS 64

static int amx_permission = 0;

int decode_attention_amx_available(void) { return amx_tiles_granted(&amx_permission); }

/* One call's shared arguments. */
struct decode_call {
    const uint16_t *q, *cache;
    const int64_t *block_ids, *seq_lens;
    uint16_t *out;
    int64_t q_stride, blocks_per_seq, num_blocks, block_size, num_heads, num_kv_heads, group;
    int64_t head_dim;
    float scale;
};

/* A task: rows [first, first + rows) (one group's) and KV head kv; its
 * queries are the rows' query heads of kv, query i = row i / group's head
 * i % group, 16 to a row tile. */
struct decode_task {
    int64_t first, rows, kv;
};

/* A thread's buffers beside its scratch: the queries as B tiles, one key
 * tile's rows where they are not 16 rows of one cache block, one block's
 * transposed scores. */
struct decode_buffers {
    uint32_t *qt;    /* [tiles][head_dim / 32][16 dim pairs][16 queries] */
    uint16_t *keys;  /* [16][head_dim] */
    float *st;       /* [4][16 keys][16 queries] */
};

/* Whether row r reads the keys of row r - 1 and more: lengths not
 * decreasing, the same blocks under row r - 1's keys. */
static int extends(const struct decode_call *c, int64_t r) {
    const int64_t before = c->seq_lens[r - 1];
    if (c->seq_lens[r] < before) return 0;
    const int64_t *a = c->block_ids + (r - 1) * c->blocks_per_seq, *b = a + c->blocks_per_seq;
    return memcmp(a, b, sizeof(int64_t) * (size_t)((before + c->block_size - 1) / c->block_size)) == 0;
}

/* The task's queries as B tiles (dimension pairs down, queries across) and
 * its state zeroed. */
static void load_queries(const struct decode_call *c, const struct decode_task *k,
                         struct scratch *w, uint32_t *qt, int64_t tiles) {
    const int64_t hd = c->head_dim, queries = k->rows * c->group;
    memset(qt, 0, (size_t)(tiles * hd / 2 * 16 * 4));
    memset(w->o, 0, (size_t)(tiles * ROWS * hd * 4));
    memset(w->sums, 0, (size_t)(tiles * ROWS * 16 * 4));
    for (int64_t i = 0; i < tiles * ROWS; i++) w->top[i] = -INFINITY;
    for (int64_t i = 0; i < queries; i++) {
        const uint32_t *src = (const uint32_t *)(c->q + (k->first + i / c->group) * c->q_stride +
                                                 (k->kv * c->group + i % c->group) * hd);
        uint32_t *tile = qt + (i / ROWS) * hd / 2 * 16;
        for (int64_t p = 0; p < hd / 2; p++) tile[p * 16 + i % ROWS] = src[p];
    }
}

/* Scores of row tile t's queries against the 64 keys of block b: C tile j
 * (keys 16 j ..) = K rows (A, straight from the cache) x the queries (B),
 * each query's column then gathered into its row of w->scores. A score is
 * the same dot product, term by term, as prefill's score_tile computes with
 * the roles of the two swapped. */
static void score_block(const struct kv_rows *s, int64_t hd, int64_t b, const uint32_t *qt,
                        int64_t valid, uint16_t *keys, float *st, float *scores) {
    for (int64_t j = 0; j < 4; j++) {
        const int64_t key0 = b * BLOCK + 16 * j;
        const uint16_t *rows;
        int64_t stride;
        if (key0 + 16 <= s->num_keys && key0 / s->block_size == (key0 + 15) / s->block_size) {
            rows = s->k + kv_offset(s, s->k_stride, key0);
            stride = s->k_stride * 2;
        } else { /* across blocks or past the last key: copied, zero past it */
            for (int64_t i = 0; i < 16; i++) {
                const int64_t key = key0 + i;
                if (key < s->num_keys)
                    memcpy(keys + i * hd, s->k + kv_offset(s, s->k_stride, key), (size_t)hd * 2);
                else
                    memset(keys + i * hd, 0, (size_t)hd * 2);
            }
            rows = keys;
            stride = hd * 2;
        }
        _tile_zero(0);
        for (int64_t half = 0; half < hd / 32; half++) {
            _tile_loadd(4, rows + 32 * half, stride);
            _tile_loadd(5, qt + half * 256, 64);
            _tile_dpbf16ps(0, 4, 5);
        }
        _tile_stored(0, st + j * 256, 64);
    }
    const __m512i column = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    for (int64_t r = 0; r < valid; r++)
        for (int64_t j = 0; j < 4; j++)
            _mm512_storeu_ps(scores + r * BLOCK + 16 * j,
                             _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32((int)r)),
                                                 st + j * 256, 4));
}

static void run_decode_task(const struct decode_call *c, const struct decode_task *k,
                            struct scratch *w, const struct decode_buffers *buf, uint32_t *vp) {
    const int64_t hd = c->head_dim, last = k->first + k->rows - 1;
    const int64_t num_keys = c->seq_lens[last], blocks = (num_keys + BLOCK - 1) / BLOCK;
    const int64_t queries = k->rows * c->group, tiles = (queries + ROWS - 1) / ROWS;
    const struct kv_rows rows = {
        c->cache + k->kv * hd, c->cache + c->num_blocks * c->block_size * c->num_kv_heads * hd + k->kv * hd,
        c->block_ids + last * c->blocks_per_seq, c->block_size, c->num_kv_heads * hd,
        c->num_kv_heads * hd, num_keys};
    load_queries(c, k, w, buf->qt, tiles);
    for (int64_t b = 0; b < blocks; b++) {
        pack_values(&rows, hd, b, vp);
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t valid = queries - t * ROWS < ROWS ? queries - t * ROWS : ROWS;
            int64_t limits[ROWS], seen = 0;
            for (int64_t r = 0; r < ROWS; r++) {
                const int64_t i = t * ROWS + r;
                limits[r] = r < valid ? c->seq_lens[k->first + i / c->group] - 1 - b * BLOCK : -1;
                seen |= limits[r] >= 0;
            }
            if (!seen) continue; /* no query of the tile sees a key of the block */
            score_block(&rows, hd, b, buf->qt + t * hd / 2 * 16, valid, buf->keys, buf->st,
                        w->scores);
            finish_block(w, t, limits, c->scale, hd, vp);
        }
    }
    for (int64_t i = 0; i < queries; i++)
        store_row(w, i, hd,
                  c->out + ((k->first + i / c->group) * c->num_heads + k->kv * c->group +
                            i % c->group) * hd);
}

int decode_attention_amx_bf16(const uint16_t *q, const uint16_t *cache, const int64_t *block_ids,
                              const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                              int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                              float scale, uint16_t *out) {
    if ((head_dim != 64 && head_dim != 128) || num_kv_heads <= 0 || num_heads % num_kv_heads ||
        num_seqs < 1 || !decode_attention_amx_available())
        return -1;
    if (check_tables(block_ids, seq_lens, num_seqs, blocks_per_seq, num_blocks, block_size))
        return -1;
    const struct decode_call c = {q, cache, block_ids, seq_lens, out, q_stride, blocks_per_seq,
                                  num_blocks, block_size, num_heads, num_kv_heads,
                                  num_heads / num_kv_heads, head_dim, scale};
    /* The groups' tasks: (first row, rows), at most TASK_ROWS rows each. */
    int64_t *spans = malloc(sizeof(int64_t) * 2 * (size_t)num_seqs);
    if (spans == NULL) return -1;
    int64_t num_spans = 0;
    for (int64_t r = 0; r < num_seqs; r++) {
        if (r > 0 && extends(&c, r) && spans[2 * num_spans - 1] < TASK_ROWS)
            spans[2 * num_spans - 1]++;
        else
            spans[2 * num_spans] = r, spans[2 * num_spans + 1] = 1, num_spans++;
    }
    const int64_t tiles = (TASK_ROWS * c.group + ROWS - 1) / ROWS;
    int64_t scratch_bytes;
    (void)carve(NULL, tiles, head_dim, &scratch_bytes);
    /* + the B tiles of the queries, a key tile, a block's transposed scores, a block's values */
    const int64_t buffer_words = tiles * head_dim / 2 * 16 + 16 * head_dim / 2 + 4 * 256;
    const int64_t per_thread = scratch_bytes + (buffer_words + BLOCK * head_dim / 2) * 4;
    const int64_t num_tasks = num_spans * num_kv_heads;
    const int64_t threads = num_tasks < omp_get_max_threads() ? num_tasks : omp_get_max_threads();
    char *scratch = aligned_alloc(64, (size_t)(per_thread * threads));
    if (scratch == NULL) {
        free(spans);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
        char *mine = scratch + per_thread * omp_get_thread_num();
        int64_t bytes;
        struct scratch w = carve(mine, tiles, head_dim, &bytes);
        uint32_t *words = (uint32_t *)(mine + scratch_bytes);
        const struct decode_buffers buf = {words, (uint16_t *)(words + tiles * head_dim / 2 * 16),
                                           (float *)(words + tiles * head_dim / 2 * 16 + 16 * head_dim / 2)};
        uint32_t *vp = words + buffer_words;
        amx_configure_tiles();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_tasks; task++) {
            const int64_t span = task / num_kv_heads;
            const struct decode_task k = {spans[2 * span], spans[2 * span + 1],
                                          task % num_kv_heads};
            run_decode_task(&c, &k, &w, &buf, vp);
        }
        _tile_release();
    }
    free(scratch);
    free(spans);
    return 0;
}

#else /* no AMX-BF16 here: decode attention stays on paged_decode_attention.c */

int decode_attention_amx_available(void) { return 0; }
int decode_attention_amx_bf16(const uint16_t *q, const uint16_t *cache, const int64_t *block_ids,
                              const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                              int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                              float scale, uint16_t *out) {
    (void)q; (void)cache; (void)block_ids; (void)seq_lens; (void)q_stride; (void)num_seqs;
    (void)blocks_per_seq; (void)num_blocks; (void)block_size; (void)num_heads;
    (void)num_kv_heads; (void)head_dim; (void)scale; (void)out;
    return -1;
}

#endif
