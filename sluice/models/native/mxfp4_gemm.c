/* Matmul of int8-quantized activations by MXFP4 weights kept in 4 bits
 * (gpt-oss's experts: sluice/models/mxfp4_experts.py):
 *
 *     w[n, k] = e2m1(code[n, k]) * 2^(E[n, g] - 127)      (g = k / 32)
 *             = c[n, k] * 2^(E[n, g] - 128),  c = 2 * e2m1 in {0, +-1, .., +-12}
 *     x[t, k] ~ sx[t, g] * xq[t, k]       (xq int8, one scale a group of 32)
 *
 *     out[t, n] = sum over g, in order, of
 *                 float(sum_{k in g} xq * c) * (sx[t, g] * 2^(E[n, g] - 128))
 *
 * The doubled E2M1 values are integers, so the sum inside a group is an exact
 * int32; each group then adds one float step in a fixed order (separate
 * multiplies and adds, no FMA contraction: see the pragma). Nothing depends
 * on how many rows share the call or how they are blocked: a row's bits are
 * its own. Activations are quantized once per call, per row and group of 32:
 * sx = amax / 127, xq = rint(x * (127 / amax)) clamped to +-127.
 *
 * Weights: per output row n, its k / 32 groups of 17 bytes, each the E8M0
 * exponent byte E and then the 16 code bytes as OpenAI's checkpoints store
 * them (value 2i in the low nibble of byte i, value 2i + 1 in the high one):
 * the file's bytes, 4.25 bits a weight.
 *
 * AVX512-VNNI (256-bit) does a group in one vpdpbusd (|c| unsigned times x
 * with c's sign); elsewhere a scalar loop gives the same integers. Work:
 * (row chunk, output) items shared statically over OpenMP's threads, so each
 * decoded weight group serves a chunk of rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "mxfp4_kernel.h"
#include "sluice_abi.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

#define GROUP MXFP4_GROUP
#define GROUP_BYTES MXFP4_GROUP_BYTES
#define ROW_CHUNK MXFP4_ROW_CHUNK

static const int8_t DOUBLED_E2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

int mxfp4_gemm_available(void) { return 1; }

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>

/* The 32 doubled values of one group's 16 code bytes, in k order. */
static inline __m256i decode_group(const uint8_t *codes) {
    const __m128i table = _mm_loadu_si128((const __m128i *)DOUBLED_E2M1);
    const __m128i low_bits = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128((const __m128i *)codes);
    const __m128i low = _mm_and_si128(bytes, low_bits);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_bits);
    const __m128i first = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(low, high));
    const __m128i second = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(low, high));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(first), second, 1);
}

static inline int32_t group_dot(__m256i w, const int8_t *xq) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    const __m256i sums =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

#else

typedef struct {
    int8_t v[GROUP];
} decoded;

static inline decoded decode_group(const uint8_t *codes) {
    decoded d;
    for (int i = 0; i < GROUP / 2; i++) {
        d.v[2 * i] = DOUBLED_E2M1[codes[i] & 0x0F];
        d.v[2 * i + 1] = DOUBLED_E2M1[codes[i] >> 4];
    }
    return d;
}

static inline int32_t group_dot(decoded w, const int8_t *xq) {
    int32_t total = 0;
    for (int i = 0; i < GROUP; i++) total += (int32_t)w.v[i] * xq[i];
    return total;
}

#endif

static void quantize_rows(const void *x, int x_bf16, int64_t rows, int64_t k, int8_t *xq,
                          float *sx) {
    const int64_t groups = k / GROUP;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t base = t * k + g * GROUP;
            float v[GROUP], amax = 0.0f;
            for (int i = 0; i < GROUP; i++) {
                v[i] = x_bf16 ? bf16_load((const uint16_t *)x + base + i)
                              : ((const float *)x)[base + i];
                amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            }
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            sx[t * groups + g] = amax / 127.0f;
            for (int i = 0; i < GROUP; i++) {
                float q = rintf(v[i] * inv);
                q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
                xq[base + i] = (int8_t)q;
            }
        }
}

int mxfp4_rows_quantize(mxfp4_rows *a, const void *x, int x_bf16, int64_t rows, int64_t k) {
    a->rows = rows, a->k = k;
    a->xq = malloc((size_t)(rows * k) + 1);
    a->sx = malloc(sizeof(float) * (size_t)(rows * (k / GROUP) + 1));
    if (a->xq == NULL || a->sx == NULL) {
        mxfp4_rows_free(a);
        return -1;
    }
    quantize_rows(x, x_bf16, rows, k, a->xq, a->sx);
    for (int e = 0; e < 256; e++) a->half_scale[e] = ldexpf(1.0f, e - 128);
    return 0;
}

void mxfp4_rows_free(mxfp4_rows *a) {
    free(a->sx);
    free(a->xq);
    a->xq = NULL, a->sx = NULL;
}

void mxfp4_item(const mxfp4_rows *a, const uint8_t *weights, int64_t r0, int count,
                int64_t column, const void *bias, void *out, int out_bf16, int64_t out_stride) {
    const int64_t k = a->k, groups = k / GROUP;
    float acc[ROW_CHUNK] = {0};
    const uint8_t *row = weights + column * groups * GROUP_BYTES;
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *group = row + g * GROUP_BYTES;
        const float step = a->half_scale[group[0]];
        const __typeof__(decode_group(group + 1)) w = decode_group(group + 1);
        for (int r = 0; r < count; r++) {
            const int64_t t = r0 + r;
            const float sum = (float)group_dot(w, a->xq + t * k + g * GROUP);
            acc[r] += sum * (a->sx[t * groups + g] * step);
        }
    }
    for (int r = 0; r < count; r++) {
        const int64_t at = (r0 + r) * out_stride + column;
        if (out_bf16) {
            const float b = bias ? bf16_load((const uint16_t *)bias + column) : 0.0f;
            bf16_store((uint16_t *)out + at, bias ? bf16_round(acc[r]) + b : acc[r]);
        } else {
            ((float *)out)[at] = bias ? acc[r] + ((const float *)bias)[column] : acc[r];
        }
    }
}

/* out[rows, n] (rows `out_stride` elements apart) = x[rows, k] W^T for W
 * [n, k] in the groups above; x and out float32, or bfloat16 where the flags
 * say so. Returns 0, or -1 when k is not whole groups or memory runs out. */
int mxfp4_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *weights,
               int64_t n, void *out, int out_bf16, int64_t out_stride) {
    if (k % GROUP != 0 || rows < 0 || n < 0) return -1;
    mxfp4_rows a;
    if (mxfp4_rows_quantize(&a, x, x_bf16, rows, k) != 0) return -1;
    const int64_t chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < chunks * n; item++) {
        const int64_t column = item % n, r0 = (item / n) * ROW_CHUNK;
        const int count = rows - r0 < ROW_CHUNK ? (int)(rows - r0) : ROW_CHUNK;
        mxfp4_item(&a, weights, r0, count, column, NULL, out, out_bf16, out_stride);
    }
    mxfp4_rows_free(&a);
    return 0;
}
