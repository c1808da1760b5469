/* qblock_gemm.c's pieces that moe_qblock.c runs too: the activations (one
 * buffer, quantized again only where a part's block sizes change), the row
 * and tile walk over spans of rows (one matrix each: a projection, or each
 * chosen expert's), and the kernel of a block format. Defined only where AVX512-VNNI is; hidden, so not exported
 * (the library exports exactly sluice_abi.h's functions). */
#ifndef QBLOCK_KERNEL_H
#define QBLOCK_KERNEL_H

#include <stdint.h>

#include "sluice_abi.h"

#define TILE 16
#define ROW_GROUP 4
/* A work item's tiles: four, which rows outside a group of four may run at
 * once (four streams of codes in flight instead of two: 7-10% less CPU a byte
 * for Q4_K at one row), while groups of four rows take them ROW_TILES at a
 * time (registers). */
#define TILE_GROUP 4
#define ROW_TILES 2
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

/* Groups of TILE_GROUP 16-column tiles over n columns: the work items of a row chunk. */
static inline int64_t qblock_tile_groups(int64_t n) {
    return ((n + TILE - 1) / TILE + TILE_GROUP - 1) / TILE_GROUP;
}

/* One matrix over rows [start, end) of the activations. */
typedef struct {
    job jb;
    int64_t start, end;
} span;

/* a's buffers for `rows` rows of width k (nothing quantized yet): 0, or -1
 * with nothing held when memory runs out; qblock_activations_free after. */
/* The kernel of p's block format; NULL: none. */
QBLOCK_HIDDEN block_fn qblock_kernel_for(const QBlockPart *p);
QBLOCK_HIDDEN int qblock_activations_alloc(activations *a, int64_t rows, int64_t k);
QBLOCK_HIDDEN void qblock_activations_free(activations *a);
/* x's rows quantized for part p's super-block and sub-block sizes (again
 * only where they differ from the last part's); the job of p writing at
 * `out` (a column slice, rows `out_stride` apart); p's kernel, or NULL where
 * there is none for its format or k is not whole super-blocks. */
QBLOCK_HIDDEN block_fn qblock_prepare(const void *x, int x_bf16, activations *a,
                                      const QBlockPart *p, void *out, int out_bf16,
                                      int64_t out_stride, job *jb);
/* Every span's (row chunk, tile group) items in one OpenMP loop, all spans'
 * matrices n columns wide and of one kernel. */
QBLOCK_HIDDEN void qblock_run_spans(block_fn kernel, const span *spans, int64_t count, int64_t n);

#endif
