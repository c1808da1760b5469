/* The int8 matmul of int8_gemm.c with AMX-INT8 tiles, for large steps
 * (prefill: hundreds to thousands of rows), on the same packed weights:
 *
 *     acc[t, n] = sum_k q[t, k] * w[n, k]     (int32, exact)
 *
 * then int8_epilogue.h's shared scaling, so its bits equal the VNNI
 * kernel's at every row (issue 28). TDPBSSD multiplies signed by signed
 * bytes: the sums are exact directly (no +128 and no compensation).
 *
 * Tiles (palette 1, all 16 rows x 64 bytes): C 0-3 (int32, 16 x 16),
 * A 4 (16 activation rows x 64 k), B 5-7 (16 k-groups x 16 columns x 4 k).
 * int8_gemm.c's packed layout IS a stack of B tiles: for column tile j, its
 * 16-column block b and the K chunk of 64 starting at group g0, the tile is
 * at packed + j * TILE_N * k + (g0 * TILE_N + b * 16) * 4, rows 256 bytes
 * apart. A work item is 16 rows x one 64-column tile: per K chunk 1 A x 4
 * B -> 4 C, the chunk's 4 KB of weights read in one contiguous pass. Two A
 * x two B over 32 rows x 32 columns (four loads per four multiplies instead
 * of five) measured no faster, 1.3x slower on [3072, 576] at 2,048 rows;
 * prefetching the next chunk's activation rows changed nothing (interleaved
 * runs on a 2-core Sapphire Rapids VM). There, [3072, 576] at 2,048 rows
 * took 1.6 ms: 0.94 of multiplies alone (2.2 int8 TMAC/s, where a tight
 * loop of tile multiplies reaches 7 on the two cores: room left) and 0.69
 * of epilogue alone (12.6 MB of bfloat16 written), overlapping little.
 *
 * Rows past the last multiple of 16 are copied into a zeroed 16-row buffer
 * first; only valid rows and columns are written out. K must be a multiple
 * of 64 (the caller, int8_gemm_bf16, keeps VNNI otherwise). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"

/* The epilogue must round exactly as torch does (int8_epilogue.h). */
#pragma GCC optimize("no-fast-math")

#define TILE_N 64
#define AMX_K 64     /* K per tile multiply */
#define ITEM_ROWS 16 /* activation rows per work item: one A tile */
/* Bytes of activation codes (a row block) kept in L2 while every weight
 * tile passes over them: bigger blocks read the weights fewer times. */
#define BLOCK_BYTES (512 * 1024)

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__)
#include <immintrin.h>
#include <omp.h>

#include "amx_tiles.h"
#include "int8_epilogue.h"

static int amx_permission = 0;

int int8_amx_available(void) { return amx_tiles_granted(&amx_permission); }

/* C tiles 0-3 -> sums [16][TILE_N]. */
static inline void store_sums(int32_t *sums) {
    _tile_stored(0, sums, TILE_N * 4);
    _tile_stored(1, sums + 16, TILE_N * 4);
    _tile_stored(2, sums + 32, TILE_N * 4);
    _tile_stored(3, sums + 48, TILE_N * 4);
}

/* One call's work: items of (row block, column tile, 16 rows), tile-major
 * within a block so that a thread's consecutive items share a weight tile;
 * a block's codes (BLOCK_BYTES) stay in L2 while every tile passes. */
struct amx_work {
    const int8_t *q, *tail, *packed; /* tail: rows from `whole` on, zero-padded to 16 */
    const float *row_scales, *col_scales;
    const uint16_t *bias;
    uint16_t *out;
    int64_t rows, whole, k, n, tiles, per_block, full_blocks, rest_groups, items_full, items;
    int pairs;
};

/* Item -> its first row t and column tile j. */
static inline void place_item(const struct amx_work *w, int64_t item, int64_t *t, int64_t *j) {
    int64_t b, within, groups;
    if (item < w->items_full) {
        b = item / (w->tiles * w->per_block);
        within = item % (w->tiles * w->per_block);
        groups = w->per_block;
    } else {
        b = w->full_blocks;
        within = item - w->items_full;
        groups = w->rest_groups;
    }
    *j = within / groups;
    *t = (b * w->per_block + within % groups) * ITEM_ROWS;
}

/* An item whose sums wait for the shared epilogue. */
struct pending {
    const int32_t *sums; /* NULL: none */
    int64_t t, j, count;
};

/* Rows [lo, hi) of the pending item through the shared epilogue (lo even
 * for A13: a pair is never split). */
static inline void finish_rows(const struct amx_work *w, const struct pending *p, int64_t lo,
                               int64_t hi) {
    if (hi <= lo) return;
    const int64_t col = p->j * TILE_N, valid = w->n - col < TILE_N ? w->n - col : TILE_N;
    const int64_t out_row = w->pairs ? (p->t + lo) / 2 : p->t + lo;
    int8_store_rows(p->sums + lo * TILE_N, TILE_N, hi - lo, w->pairs, w->row_scales + out_row,
                    w->col_scales + col, w->bias == NULL ? NULL : w->bias + col,
                    w->out + out_row * w->n + col, w->n, valid);
}

/* The rows of the pending item due after K chunk c of `chunks` (even, so
 * pairs stay whole; all of them after the last chunk). */
static inline int64_t rows_due(const struct pending *p, int64_t c, int64_t chunks) {
    return c + 1 == chunks ? p->count : ((c + 1) * p->count / chunks) & ~(int64_t)1;
}

/* 16 activation rows (a, a_stride bytes apart) times one packed weight tile
 * (w: its start), left in C tiles 0-3 (read out by `store_sums`). The
 * fourth B tile reuses the first's register once the first multiply has
 * read it. Between chunks, a share of the previous item's rows goes
 * through the epilogue: the vector units scale while the tile unit
 * multiplies (the whole epilogue after the multiplies overlapped nothing:
 * the reorder buffer fills before the tile unit is done). */
static inline void multiply_item(const struct amx_work *work, const int8_t *a, const int8_t *w,
                                 const struct pending *p) {
    const int64_t k = work->k, chunks = k / AMX_K, chunk_bytes = 16 * TILE_N * 4;
    int64_t done = 0;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < chunks; c++) {
        const int8_t *wc = w + c * chunk_bytes;
        _tile_loadd(4, a + c * AMX_K, k);
        _tile_loadd(5, wc, TILE_N * 4);
        _tile_loadd(6, wc + 64, TILE_N * 4);
        _tile_loadd(7, wc + 128, TILE_N * 4);
        _tile_dpbssd(0, 4, 5);
        _tile_dpbssd(1, 4, 6);
        _tile_loadd(5, wc + 192, TILE_N * 4);
        _tile_dpbssd(2, 4, 7);
        _tile_dpbssd(3, 4, 5);
        if (p->sums != NULL) {
            const int64_t due = rows_due(p, c, chunks);
            finish_rows(work, p, done, due);
            done = due;
        }
    }
}

/* Items [start, end) on this thread, each item's epilogue spread over the
 * next item's multiplies (the last one's after). */
static void run_items(const struct amx_work *w, int64_t start, int64_t end) {
    int32_t sums[ITEM_ROWS * TILE_N] __attribute__((aligned(64)));
    struct pending p = {.sums = NULL};
    for (int64_t item = start; item < end; item++) {
        int64_t t, j;
        place_item(w, item, &t, &j);
        const int8_t *a = t < w->whole ? w->q + t * w->k : w->tail;
        multiply_item(w, a, w->packed + j * TILE_N * w->k, &p);
        store_sums(sums);
        p = (struct pending){sums, t, j, w->rows - t < ITEM_ROWS ? w->rows - t : ITEM_ROWS};
    }
    if (p.sums != NULL) finish_rows(w, &p, 0, p.count);
}

/* int8_gemm_bf16's contract (int8_gemm.c), for k % 64 == 0 and
 * int8_amx_available(): q [rows, k] codes, A8 or A13 (`pairs`). -1 when
 * out of memory for the padded last rows (nothing written). */
int int8_amx_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                       const int8_t *packed, const float *col_scales, const uint16_t *bias,
                       int64_t n, uint16_t *out, int pairs) {
    const int64_t whole = rows / ITEM_ROWS * ITEM_ROWS;
    int8_t *tail = NULL;
    if (whole < rows) {
        tail = calloc((size_t)(ITEM_ROWS * k), 1);
        if (tail == NULL) return -1;
        memcpy(tail, q + whole * k, (size_t)((rows - whole) * k));
    }
    struct amx_work w = {.q = q, .tail = tail, .packed = packed, .row_scales = row_scales,
                         .col_scales = col_scales, .bias = bias, .out = out, .rows = rows,
                         .whole = whole, .k = k, .n = n, .pairs = pairs};
    w.tiles = (n + TILE_N - 1) / TILE_N;
    w.per_block = BLOCK_BYTES / k / ITEM_ROWS > 1 ? BLOCK_BYTES / k / ITEM_ROWS : 1;
    w.full_blocks = rows / (w.per_block * ITEM_ROWS);
    const int64_t rest = rows - w.full_blocks * w.per_block * ITEM_ROWS;
    w.rest_groups = (rest + ITEM_ROWS - 1) / ITEM_ROWS;
    w.items_full = w.full_blocks * w.tiles * w.per_block;
    w.items = w.items_full + w.tiles * w.rest_groups;
    _Pragma("omp parallel if (w.items > 1)") {
        /* Contiguous shares, as schedule(static) would give. */
        const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t share = w.items / threads, extra = w.items % threads;
        const int64_t start = id * share + (id < extra ? id : extra);
        amx_configure_tiles();
        run_items(&w, start, start + share + (id < extra ? 1 : 0));
        _tile_release();
    }
    free(tail);
    return 0;
}

#else /* no AMX-INT8 here: int8_gemm_bf16 keeps VNNI */

int int8_amx_available(void) { return 0; }
int int8_amx_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                       const int8_t *packed, const float *col_scales, const uint16_t *bias,
                       int64_t n, uint16_t *out, int pairs) {
    (void)q; (void)row_scales; (void)rows; (void)k; (void)packed; (void)col_scales;
    (void)bias; (void)n; (void)out; (void)pairs;
    return -1;
}

#endif
