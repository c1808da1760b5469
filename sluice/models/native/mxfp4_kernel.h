/* mxfp4_gemm.c's pieces that moe_mxfp4.c runs too: a call's rows quantized
 * once (int8 per group of 32), and one work item: up to MXFP4_ROW_CHUNK rows
 * times one output column, with the column's bias where one is given.
 * Hidden, so not exported (the library exports exactly sluice_abi.h's
 * functions). */
#ifndef MXFP4_KERNEL_H
#define MXFP4_KERNEL_H

#include <stdint.h>

#define MXFP4_GROUP 32
#define MXFP4_GROUP_BYTES 17
#define MXFP4_ROW_CHUNK 16

typedef struct {
    int64_t rows, k;
    int8_t *xq;             /* [rows, k] */
    float *sx;              /* [rows, k / 32] */
    float half_scale[256];  /* 2^(E - 128): the doubled E2M1 values' step */
} mxfp4_rows;

#define MXFP4_HIDDEN __attribute__((visibility("hidden")))

/* a holds x's rows [rows, k] (k whole groups) quantized: 0, or -1 with
 * nothing held when memory runs out; mxfp4_rows_free after. */
MXFP4_HIDDEN int mxfp4_rows_quantize(mxfp4_rows *a, const void *x, int x_bf16, int64_t rows,
                                     int64_t k);
MXFP4_HIDDEN void mxfp4_rows_free(mxfp4_rows *a);
/* out[r, column] for rows r0 .. r0 + count (count <= MXFP4_ROW_CHUNK) of a,
 * times W's row `column` (W [n, k] in groups of 17 bytes at `weights`); with
 * `bias` (out's dtype, [n]) the value rounded to out's dtype first and the
 * bias added in float32, as torch's `add_` on the rounded product does. */
MXFP4_HIDDEN void mxfp4_item(const mxfp4_rows *a, const uint8_t *weights, int64_t r0, int count,
                             int64_t column, const void *bias, void *out, int out_bf16,
                             int64_t out_stride);

#endif
