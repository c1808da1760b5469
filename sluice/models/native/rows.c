/* Row-wise kernels of a step: SwiGLU's activations, and the argmax of greedy sampling.
 *
 * silu_mul: x [rows, 2 * inter] holds gate then up in each row (rows start
 * row_stride elements apart); out [rows, inter] contiguous gets
 *     out = silu(gate) * up
 * rounded as torch's `F.silu(gate, inplace=True).mul_(up)` rounds in the model
 * dtype: silu computed in float32 and rounded, then the product rounded.
 *
 * argmax: x [rows, cols] float32 contiguous -> out[r] = the index of the first
 * largest value of row r; a row with a NaN gives its first NaN, as torch does.
 * One pass finds the largest value (vectorised), a second its first index.
 *
 * Rows are shared out over OpenMP threads (torch's pool, see
 * paged_decode_attention.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sluice_abi.h"
#include "bf16.h"

#include "vector_exp.h"

#define MIN_PARALLEL_ROWS 4

/* Columns per pass: silu of a chunk into a float buffer (a loop gcc
 * vectorises with glibc's vector expf), then the products. */
#define SILU_CHUNK 256

#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE, ROUND)                                       \
    void NAME(const T *x, int64_t rows, int64_t inter, int64_t row_stride, T *out) {       \
        _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")        \
        for (int64_t t = 0; t < rows; t++) {                                               \
            const T *gate = x + t * row_stride, *up = gate + inter;                        \
            T *o = out + t * inter;                                                        \
            float silu[SILU_CHUNK];                                                        \
            for (int64_t start = 0; start < inter; start += SILU_CHUNK) {                  \
                const int64_t n = inter - start < SILU_CHUNK ? inter - start : SILU_CHUNK; \
                for (int64_t j = 0; j < n; j++) silu[j] = LOAD(gate + start + j);          \
                for (int64_t j = 0; j < n; j++) silu[j] = silu[j] / (1.0f + vector_expf(-silu[j])); \
                for (int64_t j = 0; j < n; j++)                                            \
                    STORE(o + start + j, ROUND(silu[j]) * LOAD(up + start + j));           \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, bf16_load, bf16_store, bf16_round)
DEFINE_SILU_MUL(silu_mul_f32, float, f32_load, f32_store, f32_round)

/* clamped_swiglu (gpt-oss's experts): x as silu_mul's; out =
 *     (clamp(up, -limit, limit) + 1) * (g * sigmoid(alpha * g)),  g = min(gate, limit)
 * each step rounded in the model dtype as torch's ops in models/mxfp4_experts.py's
 * `clamped_swiglu` round: alpha * g, the sigmoid, g times it, up + 1, the product. */
#define DEFINE_CLAMPED_SWIGLU(NAME, T, LOAD, STORE, ROUND)                                 \
    void NAME(const T *x, int64_t rows, int64_t inter, int64_t row_stride, float alpha,    \
              float limit, T *out) {                                                       \
        _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")        \
        for (int64_t t = 0; t < rows; t++) {                                               \
            const T *gate = x + t * row_stride, *up = gate + inter;                        \
            T *o = out + t * inter;                                                        \
            float g[SILU_CHUNK], s[SILU_CHUNK];                                            \
            for (int64_t start = 0; start < inter; start += SILU_CHUNK) {                  \
                const int64_t n = inter - start < SILU_CHUNK ? inter - start : SILU_CHUNK; \
                for (int64_t j = 0; j < n; j++) {                                          \
                    const float v = LOAD(gate + start + j);                                \
                    g[j] = v > limit ? limit : v;                                          \
                    s[j] = ROUND(g[j] * alpha);                                            \
                }                                                                          \
                for (int64_t j = 0; j < n; j++) s[j] = ROUND(1.0f / (1.0f + vector_expf(-s[j]))); \
                for (int64_t j = 0; j < n; j++) {                                          \
                    float u = LOAD(up + start + j);                                        \
                    u = u > limit ? limit : (u < -limit ? -limit : u);                     \
                    STORE(o + start + j, ROUND(u + 1.0f) * ROUND(g[j] * s[j]));            \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_CLAMPED_SWIGLU(clamped_swiglu_bf16, uint16_t, bf16_load, bf16_store, bf16_round)
DEFINE_CLAMPED_SWIGLU(clamped_swiglu_f32, float, f32_load, f32_store, f32_round)

/* Lanes of the first pass: independent maxima gcc keeps in one vector. */
#define ARGMAX_LANES 16

void argmax_f32(const float *x, int64_t rows, int64_t cols, int64_t *out) {
    _Pragma("omp parallel for schedule(static) if (rows >= MIN_PARALLEL_ROWS)")
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        /* 1. The largest value (NaN aside), and whether the row has a NaN
         *    (tested on the bits: comparisons would not vectorise here). */
        float lane[ARGMAX_LANES];
        uint32_t nan_bits = 0;
        for (int i = 0; i < ARGMAX_LANES; i++) lane[i] = -INFINITY;
        const int64_t full = cols - cols % ARGMAX_LANES;
        for (int64_t c = 0; c < full; c += ARGMAX_LANES) {
            for (int i = 0; i < ARGMAX_LANES; i++) {
                const float v = row[c + i];
                uint32_t u;
                memcpy(&u, &v, sizeof u);
                nan_bits |= (u & 0x7fffffffu) > 0x7f800000u;
                lane[i] = v > lane[i] ? v : lane[i];
            }
        }
        float top = -INFINITY;
        for (int i = 0; i < ARGMAX_LANES; i++) top = lane[i] > top ? lane[i] : top;
        for (int64_t c = full; c < cols; c++) {
            nan_bits |= isnan(row[c]);
            top = row[c] > top ? row[c] : top;
        }
        /* 2. Its first index (the first NaN if any, as torch's argmax): the
         *    first block of lanes holding it, then the lane. */
        int64_t index = 0;
        for (int64_t c = 0; c < cols; c += ARGMAX_LANES) {
            const int64_t n = cols - c < ARGMAX_LANES ? cols - c : ARGMAX_LANES;
            uint32_t hit = 0;
            for (int64_t i = 0; i < n; i++) {
                const float v = row[c + i];
                uint32_t u;
                memcpy(&u, &v, sizeof u);
                hit |= nan_bits ? (u & 0x7fffffffu) > 0x7f800000u : v == top;
            }
            if (hit) {
                while (!(nan_bits ? isnan(row[c]) : row[c] == top)) c++;
                index = c;
                break;
            }
        }
        out[r] = index;
    }
}

/* merge_attention: attention of the same queries over two disjoint sets of
 * keys (a prefill chunk's cached context, and the chunk itself), each with
 * its log-sum-exp, merged into attention over both:
 *     out[t, h, :] = (a x[t, h, :] + b y[t, h, :]) / (a + b),
 *     a = exp(lx[t, h] - m), b = exp(ly[t, h] - m), m = max(lx[t, h], ly[t, h])
 * x, y, out bfloat16 [tokens, heads, dim], contiguous; lx, ly float32
 * [tokens, heads], contiguous, finite (every query sees keys in both sets).
 * One pass in float32 and one rounding, where torch's ops make seven passes
 * over strided views (20-30 ms per layer for 2,048 tokens of 9 heads). */
void merge_attention_bf16(const uint16_t *x, const float *lx, const uint16_t *y,
                          const float *ly, int64_t tokens, int64_t heads, int64_t dim,
                          uint16_t *out) {
    _Pragma("omp parallel for schedule(static) if (tokens >= MIN_PARALLEL_ROWS)")
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t h = 0; h < heads; h++) {
            const int64_t row = t * heads + h;
            const float top = lx[row] > ly[row] ? lx[row] : ly[row];
            const float a = expf(lx[row] - top), b = expf(ly[row] - top);
            const float wa = a / (a + b), wb = b / (a + b);
            const uint16_t *xr = x + row * dim, *yr = y + row * dim;
            uint16_t *o = out + row * dim;
            for (int64_t d = 0; d < dim; d++)
                bf16_store(o + d, wa * bf16_load(xr + d) + wb * bf16_load(yr + d));
        }
    }
}
