/* qblock_gemm.c's pieces that moe_qblock.c runs too: the activations'
 * quantization, one work item of rows times a tile pair, and the kernel of a
 * block format. Defined only where AVX512-VNNI is; hidden, so not exported
 * (the library exports exactly sluice_abi.h's functions). */
#ifndef QBLOCK_KERNEL_H
#define QBLOCK_KERNEL_H

#include <stdint.h>

#include "sluice_abi.h"

#define TILE 16
#define ROW_GROUP 4
#define TILE_GROUP 2
#define ROW_CHUNK 64

typedef struct {
    int bits, sub, super_block, has_scales, has_min, offset;
} qformat;

/* One quantization of a call's rows for a super-block and sub-block size. */
typedef struct {
    int64_t rows, k;
    int super_block, sub;
    int8_t *xq;     /* [rows, k] */
    float *sx;      /* [rows, k / super_block] */
    int32_t *xsum;  /* [rows, k / sub] */
    int32_t *xpair; /* [rows, k / sub / 2]: xsum[2p] (low int16) | xsum[2p+1] << 16 */
} activations;

/* Where one call writes: rows of `out`, `stride` elements apart, float32 or bfloat16. */
typedef struct {
    const uint8_t *packed;
    int64_t n, tile_bytes;
    const activations *act;
    void *out;
    int out_bf16;
    int64_t out_stride;
} job;

#define QBLOCK_HIDDEN __attribute__((visibility("hidden")))

typedef void (*block_fn)(const job *jb, int64_t r0, int rows, int64_t t0, int tiles);

/* Pairs of 16-column tiles over n columns: the work items of a row chunk. */
static inline int64_t qblock_tile_pairs(int64_t n) {
    return ((n + TILE - 1) / TILE + TILE_GROUP - 1) / TILE_GROUP;
}

/* xq and sx of a->rows rows of x (a->super_block set), then xsum and xpair (a->sub set). */
QBLOCK_HIDDEN void qblock_quantize_rows(const void *x, int x_bf16, activations *a);
QBLOCK_HIDDEN void qblock_sum_rows(activations *a);
/* The kernel of p's block format; NULL: none. */
QBLOCK_HIDDEN block_fn qblock_kernel_for(const QBlockPart *p);
/* Rows [r0, end) of jb's activations times the tile pair at tile t0. */
QBLOCK_HIDDEN void qblock_run_rows(block_fn kernel, const job *jb, int64_t r0, int64_t end, int64_t t0);

#endif
