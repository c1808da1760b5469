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

#define MIN_PARALLEL_ROWS 4

static inline float bf16_load(const uint16_t *p) {
    uint32_t u = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN. Branch-free, so loops vectorize. */
static inline void bf16_store(uint16_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    *p = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline float f32_load(const float *p) { return *p; }
static inline void f32_store(float *p, float f) { *p = f; }

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
