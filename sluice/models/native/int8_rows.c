/* The two passes around an int8 matmul with int8 activations (W8A8,
 * sluice/models/int8_activations.py):
 *
 * quantize_rows: x [rows, cols] (rows start row_stride elements apart) ->
 *     v[t, j] = x[t, j] * inv_smooth[j]          (SmoothQuant's division)
 *     scale[t] = max_j |v[t, j]| / 127            (1 for a row of zeros)
 *     q[t, j] = round_half_even(v[t, j] / scale[t]) in [-127, 127], int8 [rows, cols]
 * dequantize_rows: acc [rows, cols] int32 ->
 *     out[t, n] = round_to_dtype(acc[t, n] * row_scale[t] * col_scale[n]),
 *     then + bias[n] rounded again (as torch adds a bias to the rounded product).
 *
 * Both compute in float32; the torch fallback in int8_activations.py does the
 * same steps (tests compare the two). Rows are shared out over OpenMP
 * threads (torch's pool, see paged_decode_attention.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sluice_abi.h"
#include "bf16.h"

/* The library is built with -ffast-math; these passes must round as the
 * torch fallback does, product by product in the order written (gcc with
 * -ffast-math re-associated x * inv_smooth * inv and flipped ties of A13
 * codes), so not in this file. */
#pragma GCC optimize("no-fast-math")

#define MIN_PARALLEL_ROWS 4
/* Independent maxima of the first pass, which gcc keeps in one vector. */
#define LANES 16

/* Columns a row is smoothed in per pass: a float buffer on the stack. */
#define CHUNK 2048

#define DEFINE_QUANTIZE_ROWS(NAME, T, LOAD)                                                   \
    int NAME(const T *x, int64_t rows, int64_t cols, int64_t row_stride,                      \
             const float *inv_smooth, int8_t *q, float *scales) {                             \
        if (cols > CHUNK) return -1;                                                          \
        _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")           \
        for (int64_t t = 0; t < rows; t++) {                                                  \
            const T *row = x + t * row_stride;                                                \
            float v[CHUNK], lane[LANES];                                                      \
            for (int i = 0; i < LANES; i++) lane[i] = 0.0f;                                   \
            for (int64_t j = 0; j < cols; j++) v[j] = LOAD(row + j) * inv_smooth[j];          \
            const int64_t full = cols - cols % LANES;                                         \
            for (int64_t j = 0; j < full; j += LANES)                                         \
                for (int i = 0; i < LANES; i++) {                                             \
                    const float a = fabsf(v[j + i]);                                          \
                    lane[i] = a > lane[i] ? a : lane[i];                                      \
                }                                                                             \
            float top = 0.0f;                                                                 \
            for (int i = 0; i < LANES; i++) top = lane[i] > top ? lane[i] : top;              \
            for (int64_t j = full; j < cols; j++) top = fabsf(v[j]) > top ? fabsf(v[j]) : top; \
            const float scale = top > 0.0f ? top / 127.0f : 1.0f;                             \
            const float inv = 1.0f / scale;                                                   \
            int8_t *out = q + t * cols;                                                       \
            for (int64_t j = 0; j < cols; j++) {                                              \
                float r = rintf(v[j] * inv);                                                  \
                r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);                        \
                out[j] = (int8_t)r;                                                           \
            }                                                                                 \
            scales[t] = scale;                                                                \
        }                                                                                     \
        return 0;                                                                             \
    }

#define DEFINE_DEQUANTIZE_ROWS(NAME, T, LOAD, STORE)                                          \
    void NAME(const int32_t *acc, int64_t rows, int64_t cols, const float *row_scales,        \
              const float *col_scales, const T *bias, T *out) {                               \
        _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")           \
        for (int64_t t = 0; t < rows; t++) {                                                  \
            const int32_t *a = acc + t * cols;                                                \
            const float s = row_scales[t];                                                    \
            T *o = out + t * cols;                                                            \
            if (bias == NULL) {                                                               \
                for (int64_t n = 0; n < cols; n++) STORE(o + n, (float)a[n] * s * col_scales[n]); \
            } else {                                                                          \
                for (int64_t n = 0; n < cols; n++) {                                          \
                    T product;                                                                \
                    STORE(&product, (float)a[n] * s * col_scales[n]);                          \
                    STORE(o + n, LOAD(&product) + LOAD(bias + n));                            \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
/* bfloat16 rows with AVX-512: the same two passes and the same products in
 * the same order (x * inv_smooth, then times 1 / scale, rounded to nearest
 * even by the conversion), 16 columns at a time; gcc's vectorisation of the
 * generic loops left about 1 ns per element.
 *
 * A13 (`lo` not NULL): codes c in [-8191, 8191] (scale max |v| / 8191), each
 * stored as two int8 codes, c = 128 * hi + lo with hi = floor((c + 64) / 128)
 * in [-64, 64] and lo in [-64, 63]: the int8 matmul of both rows gives the
 * exact sums of c (int8_epilogue.h). */
#define A8_MAX_CODE 127
#define A13_MAX_CODE 8191

static void quantize_row_bf16(const uint16_t *row, int64_t cols, const float *inv_smooth,
                              int8_t *out, int8_t *lo, float *scale_out) {
    const int max_code = lo == NULL ? A8_MAX_CODE : A13_MAX_CODE;
    __m512 top16 = _mm512_setzero_ps();
    const int64_t full = cols - cols % 16;
    for (int64_t j = 0; j < full; j += 16) {
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + j))), 16));
        top16 = _mm512_max_ps(top16, _mm512_abs_ps(_mm512_mul_ps(x, _mm512_loadu_ps(inv_smooth + j))));
    }
    float top = _mm512_reduce_max_ps(top16);
    for (int64_t j = full; j < cols; j++) {
        const float a = fabsf(bf16_load(row + j) * inv_smooth[j]);
        top = a > top ? a : top;
    }
    const float scale = top > 0.0f ? top / (float)max_code : 1.0f;
    const float inv = 1.0f / scale;
    const __m512 inv16 = _mm512_set1_ps(inv);
    const __m512i hi = _mm512_set1_epi32(max_code), low = _mm512_set1_epi32(-max_code);
    const __m512i half = _mm512_set1_epi32(64);
    for (int64_t j = 0; j < full; j += 16) {
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + j))), 16));
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_loadu_ps(inv_smooth + j)), inv16);
        const __m512i r = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(v), hi), low);
        if (lo == NULL) {
            _mm_storeu_si128((__m128i *)(out + j), _mm512_cvtepi32_epi8(r));
        } else {
            const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(r, half), 7);
            _mm_storeu_si128((__m128i *)(out + j), _mm512_cvtepi32_epi8(h));
            _mm_storeu_si128((__m128i *)(lo + j),
                             _mm512_cvtepi32_epi8(_mm512_sub_epi32(r, _mm512_slli_epi32(h, 7))));
        }
    }
    for (int64_t j = full; j < cols; j++) {
        float r = rintf(bf16_load(row + j) * inv_smooth[j] * inv);
        r = r > (float)max_code ? (float)max_code : (r < -(float)max_code ? -(float)max_code : r);
        const int c = (int)r;
        if (lo == NULL) {
            out[j] = (int8_t)c;
        } else {
            const int h = (c + 64) >> 7;
            out[j] = (int8_t)h;
            lo[j] = (int8_t)(c - h * 128);
        }
    }
    *scale_out = scale;
}

/* Rows share out over the threads only when there is enough work to pay
 * for waking them (a 16 x 576 step took longer on two threads). */
#define MIN_PARALLEL_ELEMENTS 32768

int quantize_rows_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride,
                       const float *inv_smooth, int8_t *q, float *scales) {
    _Pragma("omp parallel for schedule(static) if (rows * cols >= MIN_PARALLEL_ELEMENTS)")
    for (int64_t t = 0; t < rows; t++)
        quantize_row_bf16(x + t * row_stride, cols, inv_smooth, q + t * cols, NULL, scales + t);
    return 0;
}

/* A13: q [2 * rows, cols], rows 2t and 2t + 1 the high and low codes of row t. */
int quantize_row_pairs_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride,
                            const float *inv_smooth, int8_t *q, float *scales) {
    _Pragma("omp parallel for schedule(static) if (rows * cols >= MIN_PARALLEL_ELEMENTS)")
    for (int64_t t = 0; t < rows; t++)
        quantize_row_bf16(x + t * row_stride, cols, inv_smooth, q + 2 * t * cols,
                          q + (2 * t + 1) * cols, scales + t);
    return 0;
}
#else
DEFINE_QUANTIZE_ROWS(quantize_rows_bf16, uint16_t, bf16_load)
/* A13 serves the VNNI matmul only, which needs AVX-512. */
int quantize_row_pairs_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride,
                            const float *inv_smooth, int8_t *q, float *scales) {
    (void)x; (void)rows; (void)cols; (void)row_stride; (void)inv_smooth; (void)q; (void)scales;
    return -1;
}
#endif
DEFINE_QUANTIZE_ROWS(quantize_rows_f32, float, f32_load)
DEFINE_DEQUANTIZE_ROWS(dequantize_rows_bf16, uint16_t, bf16_load, bf16_store)
DEFINE_DEQUANTIZE_ROWS(dequantize_rows_f32, float, f32_load, f32_store)
