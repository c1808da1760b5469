/* The last pass of every int8 matmul here (int8_gemm.c's VNNI kernel and
 * int8_amx.c's AMX-INT8 one): exact int32 sums -> one bfloat16 output row.
 *
 *     A8:  f = (float)s[n]
 *     A13: f = (float)s_hi[n] * 128 + (float)s_lo[n]   (codes c = 128 * hi + lo)
 *     out[n] = round_bf16(f * row_scale * col_scale[n]), then + bias[n] rounded again
 *
 * The sums are exact whatever kernel made them, and every kernel scales them
 * with this one function, so a row's bits never depend on which kernel, how
 * many rows or which tile computed it (issue 28). The multiply by 128 is
 * exact, so a fused multiply-add there rounds as the separate operations do;
 * nothing else may be reassociated: the files including this one turn
 * -ffast-math off. */
#ifndef SLUICE_INT8_EPILOGUE_H
#define SLUICE_INT8_EPILOGUE_H

#include <immintrin.h>
#include <stdint.h>

/* float32 -> bfloat16 bits (round to nearest even; no NaN can arise here). */
static inline __m256i int8_round_to_bf16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static inline __m512 int8_bf16_to_f32(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* `valid` columns of one output row from its exact sums (sums_lo: NULL for A8). */
static inline void int8_store_row(const int32_t *sums, const int32_t *sums_lo, float row_scale,
                                  const float *col_scales, const uint16_t *bias, uint16_t *out,
                                  int64_t valid) {
    const __m512 rs = _mm512_set1_ps(row_scale), step = _mm512_set1_ps(128.0f);
    for (int64_t j = 0; j < valid; j += 16) {
        const int64_t left = valid - j;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 f = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(mask, sums + j));
        if (sums_lo != NULL)
            f = _mm512_add_ps(_mm512_mul_ps(f, step),
                              _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(mask, sums_lo + j)));
        f = _mm512_mul_ps(_mm512_mul_ps(f, rs), _mm512_maskz_loadu_ps(mask, col_scales + j));
        __m256i h = int8_round_to_bf16(f);
        if (bias != NULL) {
            const __m256i b = _mm256_maskz_loadu_epi16(mask, bias + j);
            h = int8_round_to_bf16(_mm512_add_ps(int8_bf16_to_f32(h), int8_bf16_to_f32(b)));
        }
        _mm256_mask_storeu_epi16(out + j, mask, h);
    }
}

/* Sums of `rows` activation rows (row r at sums + r * stride), scaled into
 * output rows: one per row (A8), or one per pair of rows hi, lo (A13, `pairs`). */
static inline void int8_store_rows(const int32_t *sums, int64_t stride, int64_t rows, int pairs,
                                   const float *row_scales, const float *col_scales,
                                   const uint16_t *bias, uint16_t *out, int64_t out_stride,
                                   int64_t valid) {
    if (pairs) {
        for (int64_t r = 0; r + 1 < rows; r += 2)
            int8_store_row(sums + r * stride, sums + (r + 1) * stride, row_scales[r / 2],
                           col_scales, bias, out + (r / 2) * out_stride, valid);
    } else {
        for (int64_t r = 0; r < rows; r++)
            int8_store_row(sums + r * stride, NULL, row_scales[r], col_scales, bias,
                           out + r * out_stride, valid);
    }
}

#endif
