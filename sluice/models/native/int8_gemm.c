/* The int8 matmul of W8A8 (sluice/models/int8_activations.py) with AVX512-VNNI,
 * on weights packed once at load, its result scaled straight to bfloat16:
 *
 *     out[t, n] = round_bf16(acc[t, n] * row_scale[t] * col_scale[n])   (then + bias[n], rounded)
 *     acc[t, n] = sum_k q[t, k] * w[n, k]                                (int32, exact)
 *
 * the same values as torch._int_mm followed by dequantize_rows_bf16
 * (int8_rows.c). oneDNN's s8s8 gemm behind _int_mm packs the weight matrix on
 * every call, which at 16 rows costs about as much as the multiply; here it
 * is packed once (`pack_int8_weights`).
 *
 * VNNI's vpdpbusd multiplies unsigned by signed bytes, four per int32 lane.
 * The activations' codes q (signed, [-127, 127]) are fed as q + 128 (one xor
 * of the sign bit) and the extra 128 * sum_k w[n, k] is taken off again:
 * `compensation[n]`, computed at packing. int32 cannot overflow for K below
 * 2^31 / (255 * 127), about 66,000.
 *
 * Packed layout: columns in tiles of 64 (TILE_N; the last one zero-padded),
 * K in groups of 4 (K % 4 == 0). For tile j and group g, 256 bytes: four
 * zmm-sized blocks of 16 columns, each column's 4 consecutive k. So the inner
 * loop reads one contiguous stream per tile.
 *
 * Work split: rows in blocks of ROW_BLOCK (a block's activation rows stay
 * in L2 while every weight tile passes), (row block, column tile, 6 rows)
 * items shared out statically over torch's OpenMP threads; rows go
 * 6 at a time (24 accumulators + 4 weight registers + 1 broadcast = 29 of
 * the 32 zmm registers).
 *
 * Large steps go to int8_amx.c's AMX-INT8 kernel instead, where there is
 * one (`amx_min_rows`): the same packed weights, the same exact sums. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"

/* The library is built with -ffast-math; the scaling here must round exactly
 * as torch does (product by product, in this order), so not in this file. */
#pragma GCC optimize("no-fast-math")

#define TILE_N 64
#define ROW_BLOCK 192

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include "int8_epilogue.h"

int int8_gemm_available(void) { return 1; }

/* w [n, k] int8 row-major -> packed (size int8_packed_bytes(n, k)), compensation [n] int32. */
int64_t int8_packed_bytes(int64_t n, int64_t k) {
    return ((n + TILE_N - 1) / TILE_N) * TILE_N * k;
}

int pack_int8_weights(const int8_t *w, int64_t n, int64_t k, int8_t *packed,
                      int32_t *compensation) {
    if (k % 4 != 0) return -1;
    const int64_t groups = k / 4;
    memset(packed, 0, (size_t)int8_packed_bytes(n, k));
    for (int64_t col = 0; col < n; col++) {
        const int64_t tile = col / TILE_N, lane = col % TILE_N;
        int32_t sum = 0;
        for (int64_t g = 0; g < groups; g++) {
            int8_t *dst = packed + ((tile * groups + g) * TILE_N + lane) * 4;
            for (int i = 0; i < 4; i++) {
                dst[i] = w[col * k + g * 4 + i];
                sum += dst[i];
            }
        }
        compensation[col] = 128 * sum;
    }
    return 0;
}

/* One group of ROWS activation rows' accumulators: made exact (the
 * compensation taken off) into `sums` [ROWS][TILE_N], then scaled by the
 * shared epilogue (int8_epilogue.h). Only the tile's `valid` columns of
 * `comp` are read: the caller's compensation has n entries, not whole tiles
 * (a vocabulary of 32,001 ends 63 columns into its last tile); the sums of
 * the columns past it are never stored. */
static inline void exact_sums(const __m512i acc[4], const int32_t *comp, int64_t valid,
                              int32_t *sums) {
    for (int j = 0; j < 4; j++) {
        const int64_t left = valid - 16 * j;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xffff
                               : left > 0 ? (__mmask16)((1u << left) - 1)
                                          : (__mmask16)0;
        const __m512i c = _mm512_maskz_loadu_epi32(mask, comp + 16 * j);
        _mm512_storeu_si512(sums + 16 * j, _mm512_sub_epi32(acc[j], c));
    }
}

/* ROWS (1..6) activation rows times one packed weight tile. Each
 * accumulator is its own variable (an array of them, gcc spilled to the
 * stack every group): rows past ROWS are dead code the compiler drops. */
#define ROW_STEP(R)                                                                           \
    if (tile_rows > R) {                                                                         \
        const __m512i a = _mm512_xor_si512(                                                   \
            _mm512_set1_epi32(*(const int32_t *)(q + R * k + g * 4)), flip);                  \
        c##R##0 = _mm512_dpbusd_epi32(c##R##0, a, w0);                                        \
        c##R##1 = _mm512_dpbusd_epi32(c##R##1, a, w1);                                        \
        c##R##2 = _mm512_dpbusd_epi32(c##R##2, a, w2);                                        \
        c##R##3 = _mm512_dpbusd_epi32(c##R##3, a, w3);                                        \
    }
#define ROW_ZERO(R) __m512i c##R##0 = zero, c##R##1 = zero, c##R##2 = zero, c##R##3 = zero;
#define ROW_STORE(R)                                                                          \
    if (tile_rows > R) {                                                                         \
        const __m512i acc[4] = {c##R##0, c##R##1, c##R##2, c##R##3};                          \
        exact_sums(acc, comp, valid, sums + R * TILE_N);                                      \
    }

#define DEFINE_TILE(ROWS)                                                                     \
    static void tile_##ROWS(const int8_t *q, int64_t k, const int8_t *w, const int32_t *comp, \
                            const float *row_scales, const float *col_scales,                 \
                            const uint16_t *bias, uint16_t *out, int64_t n, int64_t valid,    \
                            int pairs) {                                                      \
        const int tile_rows = ROWS;                                                           \
        int32_t sums[6 * TILE_N];                                                           \
        const __m512i zero = _mm512_setzero_si512();                                          \
        const __m512i flip = _mm512_set1_epi32((int)0x80808080u);                             \
        ROW_ZERO(0) ROW_ZERO(1) ROW_ZERO(2) ROW_ZERO(3) ROW_ZERO(4) ROW_ZERO(5)               \
        const int64_t groups = k / 4;                                                         \
        for (int64_t g = 0; g < groups; g++) {                                                \
            const int8_t *wg = w + g * TILE_N * 4;                                            \
            const __m512i w0 = _mm512_loadu_si512(wg), w1 = _mm512_loadu_si512(wg + 64);      \
            const __m512i w2 = _mm512_loadu_si512(wg + 128), w3 = _mm512_loadu_si512(wg + 192); \
            ROW_STEP(0) ROW_STEP(1) ROW_STEP(2) ROW_STEP(3) ROW_STEP(4) ROW_STEP(5)           \
        }                                                                                     \
        ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) ROW_STORE(4) ROW_STORE(5)         \
        int8_store_rows(sums, TILE_N, ROWS, pairs, row_scales, col_scales, bias, out, n, valid); \
    }

DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
DEFINE_TILE(4)
DEFINE_TILE(5)
DEFINE_TILE(6)

typedef void (*tile_fn)(const int8_t *, int64_t, const int8_t *, const int32_t *, const float *,
                        const float *, const uint16_t *, uint16_t *, int64_t, int64_t, int);
static const tile_fn TILES[7] = {NULL, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

/* q [rows, k] int8 codes (row-major); packed weights of [n, k] with
 * compensation [n] and col_scales [n]; bias [n] bf16 or NULL. A8: row_scales
 * [rows], out [rows, n] bf16 row-major. A13 (`pairs`, rows even): rows 2i and
 * 2i + 1 are output row i's high and low codes, row_scales [rows / 2], out
 * [rows / 2, n]. `amx_min_rows`: see below. */
void int8_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                    const int8_t *packed, const int32_t *compensation, const float *col_scales,
                    const uint16_t *bias, int64_t n, uint16_t *out, int pairs,
                    int64_t amx_min_rows) {
    /* From amx_min_rows code rows on (0: never), AMX-INT8 tiles where the
     * CPU and Linux allow them and K is whole tiles: the same exact sums,
     * so the same bits (int8_amx.c). */
    if (amx_min_rows > 0 && rows >= amx_min_rows && k % 64 == 0 && int8_amx_available() &&
        int8_amx_gemm_bf16(q, row_scales, rows, k, packed, col_scales, bias, n, out, pairs) == 0)
        return;
    /* Work items: (row block, column tile, group of 6 rows), tile-major
     * within a block so that a thread's consecutive items share a weight
     * tile; shared out statically. Splitting rows as well as columns keeps
     * the threads level when there are few tiles: o_proj's 9 tiles at 16
     * rows ran 1.12x faster on two threads than on one, split by tile only. */
    const int64_t tiles = (n + TILE_N - 1) / TILE_N;
    const int64_t full_blocks = rows / ROW_BLOCK, groups_per_block = ROW_BLOCK / 6;
    const int64_t rest = rows - full_blocks * ROW_BLOCK, rest_groups = (rest + 5) / 6;
    const int64_t items_full = full_blocks * tiles * groups_per_block;
    const int64_t items = items_full + tiles * rest_groups;
    _Pragma("omp parallel for schedule(static) if (items >= 4)")
    for (int64_t item = 0; item < items; item++) {
        int64_t b, within, groups;
        if (item < items_full) {
            b = item / (tiles * groups_per_block);
            within = item % (tiles * groups_per_block);
            groups = groups_per_block;
        } else {
            b = full_blocks;
            within = item - items_full;
            groups = rest_groups;
        }
        const int64_t j = within / groups, t = b * ROW_BLOCK + (within % groups) * 6;
        const int64_t end = b == full_blocks ? rows : (b + 1) * ROW_BLOCK;
        const int64_t count = end - t < 6 ? end - t : 6;
        const int64_t col = j * TILE_N, valid = n - col < TILE_N ? n - col : TILE_N;
        const int64_t out_row = pairs ? t / 2 : t;
        TILES[count](q + t * k, k, packed + j * TILE_N * k, compensation + col,
                     row_scales + out_row, col_scales + col, bias == NULL ? NULL : bias + col,
                     out + out_row * n + col, n, valid, pairs);
    }
}

/* The whole layer: quantize x [rows, k] (rows x_stride apart; A13 when
 * `pairs`), then the matmul above; one call from Python instead of two (each
 * call and its tensors cost microseconds, 90 times a step). amx_min_rows
 * counts code rows, as int8_gemm_bf16 does (A13: two per row of x). -1 when
 * out of memory. */
int int8_linear_bf16(const uint16_t *x, int64_t rows, int64_t k, int64_t x_stride,
                     const float *inv_smooth, const int8_t *packed, const int32_t *compensation,
                     const float *col_scales, const uint16_t *bias, int64_t n, uint16_t *out,
                     int pairs, int64_t amx_min_rows) {
    const int64_t code_rows = pairs ? 2 * rows : rows;
    int8_t *q = malloc((size_t)(code_rows * k));
    float *scales = malloc(sizeof(float) * (size_t)rows);
    int status = -1;
    const int quantized = q != NULL && scales != NULL &&
        (pairs ? quantize_row_pairs_bf16(x, rows, k, x_stride, inv_smooth, q, scales)
               : quantize_rows_bf16(x, rows, k, x_stride, inv_smooth, q, scales)) == 0;
    if (quantized) {
        int8_gemm_bf16(q, scales, code_rows, k, packed, compensation, col_scales, bias, n, out,
                       pairs, amx_min_rows);
        status = 0;
    }
    free(q);
    free(scales);
    return status;
}

#else /* no AVX512-VNNI: the caller keeps torch._int_mm */

int int8_gemm_available(void) { return 0; }
int64_t int8_packed_bytes(int64_t n, int64_t k) { return n * k; }
int pack_int8_weights(const int8_t *w, int64_t n, int64_t k, int8_t *packed,
                      int32_t *compensation) {
    (void)w; (void)n; (void)k; (void)packed; (void)compensation;
    return -1;
}
int int8_linear_bf16(const uint16_t *x, int64_t rows, int64_t k, int64_t x_stride,
                     const float *inv_smooth, const int8_t *packed, const int32_t *compensation,
                     const float *col_scales, const uint16_t *bias, int64_t n, uint16_t *out,
                     int pairs, int64_t amx_min_rows) {
    (void)pairs; (void)amx_min_rows; (void)x; (void)rows; (void)k; (void)x_stride; (void)inv_smooth; (void)packed;
    (void)compensation; (void)col_scales; (void)bias; (void)n; (void)out;
    return -1;
}
void int8_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                    const int8_t *packed, const int32_t *compensation, const float *col_scales,
                    const uint16_t *bias, int64_t n, uint16_t *out, int pairs,
                    int64_t amx_min_rows) {
    (void)pairs; (void)amx_min_rows; (void)q; (void)row_scales; (void)rows; (void)k; (void)packed; (void)compensation;
    (void)col_scales; (void)bias; (void)n; (void)out;
}

#endif
