/* RMSNorm in one pass per row, in float32, rounded once to the model dtype
 * (torch's bfloat16 rms_norm rounds before and after the weight):
 *
 *   out[t, j] = x[t, j] / sqrt(mean_j(x[t, j]^2) + eps) * w[j]
 *
 * x rows start row_stride elements apart; out is contiguous. Rows are shared
 * out over OpenMP threads (torch's pool, see paged_decode_attention.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sluice_abi.h"
#include "bf16.h"

#define MIN_PARALLEL_ROWS 4

#define DEFINE_RMS_NORM(NAME, T, LOAD, STORE)                                          \
    void NAME(const T *x, const T *w, int64_t rows, int64_t hidden, int64_t row_stride, \
              float eps, T *out) {                                                     \
        _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")    \
        for (int64_t t = 0; t < rows; t++) {                                           \
            const T *row = x + t * row_stride;                                         \
            float sum = 0.0f;                                                          \
            for (int64_t j = 0; j < hidden; j++) {                                     \
                const float v = LOAD(row + j);                                         \
                sum += v * v;                                                          \
            }                                                                          \
            const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);                 \
            T *o = out + t * hidden;                                                   \
            for (int64_t j = 0; j < hidden; j++) STORE(o + j, LOAD(row + j) * inv * LOAD(w + j)); \
        }                                                                              \
    }

DEFINE_RMS_NORM(rms_norm_bf16, uint16_t, bf16_load, bf16_store)
DEFINE_RMS_NORM(rms_norm_f32, float, f32_load, f32_store)
