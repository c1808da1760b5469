/* Matmul of int8-quantized activations by weights kept in their GGUF block
 * codes (sluice/loader/gguf_blocks.py), packed once at load
 * (sluice/models/qblocks.py) for AVX512-VNNI:
 *
 *     w[n, k] = D[n,s] * SC[n,j] * (q[n,k] - OFFSET) - M[n,s] * MN[n,j]
 *     x[t, k] ~ sx[t,s] * xq[t,k]          (xq int8, one scale a super-block)
 *
 *     out[t, n] = sum over s, in order, of
 *                 sx[t,s] * (D * float(A) - M * float(B))
 *     A = sum_j SC_j * (sum_k xq * q - OFFSET * xsum_j)      (int32, exact)
 *     B = sum_j MN_j * xsum_j,   xsum_j = sum_{k in j} xq   (int32, exact)
 *
 * which is llama.cpp's arithmetic for the same block types: exact integer
 * sums inside a super-block, then one float step per super-block in a fixed
 * order. Nothing depends on how many rows share the call, so a row's bits
 * are its own (the row-invariant default holds on this path); the float
 * steps are separate multiplies and adds (no FMA contraction, see the
 * pragma), so numpy's float32 reproduces them exactly.
 *
 * Activations are quantized here, per row and super-block, as llama.cpp's
 * Q8_K/Q8_0 are: sx = amax / 127, xq = rint(x * (127 / amax)).
 *
 * Packed layout: output columns in tiles of 16 (one zmm of int32 sums, one
 * lane a column; the last tile zero-padded at packing, so no read runs past
 * the buffer whatever n is). A tile is its super-blocks one after another,
 * each `super_bytes` long:
 *     D[16] f16, then M[16] f16 (has_min)
 *     for each sub-block: SC[16] i8 (has_scales), MN[16] i8 (has_scales && has_min),
 *                         the codes: for bits 4-6, per 8 k: 64 bytes, byte
 *                         c*4+i = q[c,k+i] & 15 | (q[c,k+4+i] & 15) << 4;
 *                         then the high bits: bits 5: per 32 k, 64 bytes, byte c*4+i
 *                         bit 2g+h = bit 4 of q[c, k+8g+4h+i]; bits 6: per 16 k, 64
 *                         bytes, bits 2(2g+h)..+1 = bits 4-5 of q[c, k+8g+4h+i];
 *                         bits 8: per 4 k, 64 bytes, byte c*4+i = q[c,k+i].
 * Work: (row chunk, tile) items shared statically over OpenMP's threads; rows
 * four at a time share each loaded weight vector. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

#define TILE 16
#define ROW_GROUP 4
#define ROW_CHUNK 64

typedef struct {
    int bits, sub, super_block, has_scales, has_min, offset;
} qformat;

static int64_t sub_bytes(const qformat *f) {
    int64_t codes = (int64_t)TILE * f->sub * f->bits / 8;
    return codes + (f->has_scales ? TILE : 0) + (f->has_scales && f->has_min ? TILE : 0);
}

int64_t qblock_super_bytes(int bits, int sub, int super_block, int has_scales, int has_min) {
    qformat f = {bits, sub, super_block, has_scales, has_min, 0};
    return 2 * TILE * (1 + (has_min ? 1 : 0)) + (super_block / sub) * sub_bytes(&f);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

int qblock_gemm_available(void) { return 1; }

static float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

static uint16_t f32_to_bf16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* One row's activations -> xq (k int8), sx (k / super floats), xsum (k / sub ints). */
static void quantize_row(const float *x, int64_t k, const qformat *f, int8_t *xq, float *sx,
                         int32_t *xsum) {
    for (int64_t s = 0; s < k / f->super_block; s++) {
        const float *xs = x + s * f->super_block;
        float amax = 0.0f;
        for (int i = 0; i < f->super_block; i++) amax = fmaxf(amax, fabsf(xs[i]));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        sx[s] = amax / 127.0f;
        for (int i = 0; i < f->super_block; i++) {
            float v = rintf(xs[i] * inv);
            xq[s * f->super_block + i] = (int8_t)(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
        }
    }
    for (int64_t j = 0; j < k / f->sub; j++) {
        int32_t total = 0;
        for (int i = 0; i < f->sub; i++) total += xq[j * f->sub + i];
        xsum[j] = total;
    }
}

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The codes of one sub-block times `rows` rows' activations at k0: isum[r] += ... */
static inline __attribute__((always_inline)) void sub_block_sums(
    const uint8_t *codes, const qformat *f, const int8_t *const *xq, int rows, int64_t k0,
    __m512i *isum) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (f->bits == 8) {
        for (int g = 0; g < f->sub / 4; g++) {
            __m512i w = _mm512_loadu_si512(codes + 64 * g);
            for (int r = 0; r < rows; r++)
                isum[r] = _mm512_dpbusd_epi32(isum[r], w, bcast4(xq[r] + k0 + 4 * g));
        }
        return;
    }
    const uint8_t *high = codes + (int64_t)TILE * f->sub / 2;
    __m512i hb = _mm512_setzero_si512();
    for (int g = 0; g < f->sub / 8; g++) {
        __m512i v = _mm512_loadu_si512(codes + 64 * g);
        __m512i qa = _mm512_and_si512(v, low4);
        __m512i qb = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        if (f->bits == 5) {
            if (g % 4 == 0) hb = _mm512_loadu_si512(high + 64 * (g / 4));
            const __m512i bit4 = _mm512_set1_epi8(0x10);
            qa = _mm512_or_si512(qa, _mm512_and_si512(_mm512_slli_epi16(hb, 4), bit4));
            qb = _mm512_or_si512(qb, _mm512_and_si512(_mm512_slli_epi16(hb, 3), bit4));
            hb = _mm512_srli_epi16(hb, 2);
        } else if (f->bits == 6) {
            if (g % 2 == 0) hb = _mm512_loadu_si512(high + 64 * (g / 2));
            const __m512i bits45 = _mm512_set1_epi8(0x30);
            qa = _mm512_or_si512(qa, _mm512_and_si512(_mm512_slli_epi16(hb, 4), bits45));
            qb = _mm512_or_si512(qb, _mm512_and_si512(_mm512_slli_epi16(hb, 2), bits45));
            hb = _mm512_srli_epi16(hb, 4);
        }
        for (int r = 0; r < rows; r++) {
            isum[r] = _mm512_dpbusd_epi32(isum[r], qa, bcast4(xq[r] + k0 + 8 * g));
            isum[r] = _mm512_dpbusd_epi32(isum[r], qb, bcast4(xq[r] + k0 + 8 * g + 4));
        }
    }
}

/* One tile of 16 columns for `rows` (<= ROW_GROUP) rows: acc[r] = out[r, tile]. */
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile, int64_t k, const qformat *f, const int8_t *const *xq,
    const float *const *sx, const int32_t *const *xsum, int rows, __m512 *acc) {
    const int64_t per_super = f->super_block / f->sub;
    const int64_t sb = sub_bytes(f);
    const uint8_t *p = tile;
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k / f->super_block; s++) {
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 m = _mm512_setzero_ps();
        p += 2 * TILE;
        if (f->has_min) {
            m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
            p += 2 * TILE;
        }
        __m512i a[ROW_GROUP], b[ROW_GROUP];
        for (int r = 0; r < rows; r++) a[r] = b[r] = _mm512_setzero_si512();
        for (int64_t j = 0; j < per_super; j++, p += sb) {
            const int64_t sub_index = s * per_super + j;
            const uint8_t *codes = p;
            __m512i sc = _mm512_set1_epi32(1), mn = _mm512_set1_epi32(1);
            if (f->has_scales) {
                sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes));
                codes += TILE;
                if (f->has_min) {
                    mn = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes));
                    codes += TILE;
                }
            }
            __m512i isum[ROW_GROUP];
            for (int r = 0; r < rows; r++) isum[r] = _mm512_setzero_si512();
            sub_block_sums(codes, f, xq, rows, sub_index * f->sub, isum);
            for (int r = 0; r < rows; r++) {
                __m512i xs = _mm512_set1_epi32(xsum[r][sub_index]);
                __m512i t = isum[r];
                if (f->offset) t = _mm512_sub_epi32(t, _mm512_mullo_epi32(xs, _mm512_set1_epi32(f->offset)));
                a[r] = _mm512_add_epi32(a[r], f->has_scales ? _mm512_mullo_epi32(sc, t) : t);
                if (f->has_min)
                    b[r] = _mm512_add_epi32(b[r], f->has_scales ? _mm512_mullo_epi32(mn, xs) : xs);
            }
        }
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(a[r]));
            if (f->has_min) v = _mm512_sub_ps(v, _mm512_mul_ps(m, _mm512_cvtepi32_ps(b[r])));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(v, _mm512_set1_ps(sx[r][s])));
        }
    }
}

static inline __attribute__((always_inline)) void run_format(
    const uint8_t *packed, int64_t n, int64_t k, const qformat *f, const int8_t *xq,
    const float *sx, const int32_t *xsum, int64_t rows, float *out, int64_t out_stride) {
    const int64_t tiles = (n + TILE - 1) / TILE;
    const int64_t chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
    const int64_t tile_bytes = (k / f->super_block) *
        qblock_super_bytes(f->bits, f->sub, f->super_block, f->has_scales, f->has_min);
    const int64_t n_super = k / f->super_block, n_sub = k / f->sub;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < chunks * tiles; item++) {
        const int64_t chunk = item / tiles, t = item % tiles;
        const int64_t end = rows < (chunk + 1) * ROW_CHUNK ? rows : (chunk + 1) * ROW_CHUNK;
        for (int64_t r0 = chunk * ROW_CHUNK; r0 < end; r0 += ROW_GROUP) {
            const int count = end - r0 < ROW_GROUP ? (int)(end - r0) : ROW_GROUP;
            const int8_t *xqs[ROW_GROUP];
            const float *sxs[ROW_GROUP];
            const int32_t *xsums[ROW_GROUP];
            for (int r = 0; r < count; r++) {
                xqs[r] = xq + (r0 + r) * k;
                sxs[r] = sx + (r0 + r) * n_super;
                xsums[r] = xsum + (r0 + r) * n_sub;
            }
            __m512 acc[ROW_GROUP] = {0};
            const uint8_t *tile = packed + t * tile_bytes;
            /* A constant row count unrolls the row loops into registers. */
            switch (count) {
            case 4: tile_rows(tile, k, f, xqs, sxs, xsums, 4, acc); break;
            case 3: tile_rows(tile, k, f, xqs, sxs, xsums, 3, acc); break;
            case 2: tile_rows(tile, k, f, xqs, sxs, xsums, 2, acc); break;
            default: tile_rows(tile, k, f, xqs, sxs, xsums, 1, acc); break;
            }
            const int64_t width = n - t * TILE < TILE ? n - t * TILE : TILE;
            const __mmask16 keep = (__mmask16)((1u << width) - 1u);
            for (int r = 0; r < count; r++)
                _mm512_mask_storeu_ps(out + (r0 + r) * out_stride + t * TILE, keep, acc[r]);
        }
    }
}

#define FORMAT_CASE(B, SUB, SUPER, SC, MIN, OFF)                                        \
    if (f.bits == B && f.sub == SUB && f.super_block == SUPER && f.has_scales == SC &&  \
        f.has_min == MIN && f.offset == OFF) {                                           \
        const qformat c = {B, SUB, SUPER, SC, MIN, OFF};                                 \
        run_format(packed, n, k, &c, xq, sx, xsum, rows, out, out_stride);                           \
        return 0;                                                                        \
    }

static int dispatch(const uint8_t *packed, int64_t n, int64_t k, qformat f, const int8_t *xq,
                    const float *sx, const int32_t *xsum, int64_t rows, float *out,
                    int64_t out_stride) {
    FORMAT_CASE(4, 32, 256, 1, 1, 0)  /* Q4_K */
    FORMAT_CASE(5, 32, 256, 1, 1, 0)  /* Q5_K */
    FORMAT_CASE(6, 16, 256, 1, 0, 32) /* Q6_K */
    FORMAT_CASE(4, 32, 32, 0, 0, 8)   /* Q4_0 */
    FORMAT_CASE(4, 32, 32, 0, 1, 0)   /* Q4_1 */
    FORMAT_CASE(5, 32, 32, 0, 0, 16)  /* Q5_0 */
    FORMAT_CASE(5, 32, 32, 0, 1, 0)   /* Q5_1 */
    FORMAT_CASE(8, 32, 32, 0, 0, 128) /* Q8_0 */
    return -1;
}

/* out[rows, n] = x[rows, k] W^T, out's rows `out_stride` elements apart (a
 * slice of a wider output). x and out are float32, or bfloat16 where the
 * flags say so. Returns 0, or -1 for a format it has no kernel for. */
int qblock_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *packed,
                int64_t n, int bits, int sub, int super_block, int has_scales, int has_min,
                int offset, void *out, int out_bf16, int64_t out_stride) {
    qformat f = {bits, sub, super_block, has_scales, has_min, offset};
    int8_t *xq = malloc((size_t)(rows * k));
    float *sx = malloc(sizeof(float) * (size_t)(rows * (k / super_block) + 1));
    int32_t *xsum = malloc(sizeof(int32_t) * (size_t)(rows * (k / sub) + 1));
    float *row = malloc(sizeof(float) * (size_t)k);
    float *result = out_bf16 ? malloc(sizeof(float) * (size_t)(rows * n)) : (float *)out;
    const int64_t result_stride = out_bf16 ? n : out_stride;
    int status = -1;
    if (xq && sx && xsum && row && result) {
        for (int64_t t = 0; t < rows; t++) {
            const float *source = (const float *)x + t * k;
            if (x_bf16) {
                for (int64_t i = 0; i < k; i++) row[i] = bf16_to_f32(((const uint16_t *)x)[t * k + i]);
                source = row;
            }
            quantize_row(source, k, &f, xq + t * k, sx + t * (k / super_block),
                         xsum + t * (k / sub));
        }
        status = dispatch(packed, n, k, f, xq, sx, xsum, rows, result, result_stride);
        if (status == 0 && out_bf16)
            for (int64_t t = 0; t < rows; t++)
                for (int64_t i = 0; i < n; i++)
                    ((uint16_t *)out)[t * out_stride + i] = f32_to_bf16(result[t * n + i]);
    }
    if (out_bf16) free(result);
    free(row);
    free(xsum);
    free(sx);
    free(xq);
    return status;
}

/* The float32 values of weight rows `ids[0..count)` (the embedding lookup of
 * a tied or quantized table), exactly as llama.cpp dequantizes them:
 * (D * SC) * (q - OFFSET) - M * MN, one rounding. */
static int code_at(const uint8_t *codes, const qformat *f, int lane, int i) {
    if (f->bits == 8) return codes[64 * (i / 4) + lane * 4 + i % 4];
    const int g = i / 8, h = (i % 8) / 4, byte = lane * 4 + i % 4;
    int q = (codes[64 * g + byte] >> (4 * h)) & 15;
    const uint8_t *high = codes + (int64_t)TILE * f->sub / 2;
    if (f->bits == 5) q |= ((high[64 * (g / 4) + byte] >> (2 * (g % 4) + h)) & 1) << 4;
    if (f->bits == 6) q |= ((high[64 * (g / 2) + byte] >> (2 * (2 * (g % 2) + h))) & 3) << 4;
    return q;
}

static float half_to_f32(const uint8_t *p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | (p[1] << 8))));
}

int qblock_rows(const uint8_t *packed, int64_t n, int64_t k, int bits, int sub, int super_block,
                int has_scales, int has_min, int offset, const int64_t *ids, int64_t count,
                float *out) {
    const qformat f = {bits, sub, super_block, has_scales, has_min, offset};
    const int64_t super_bytes = qblock_super_bytes(bits, sub, super_block, has_scales, has_min);
    const int64_t tile_bytes = (k / super_block) * super_bytes, sb = sub_bytes(&f);
    for (int64_t r = 0; r < count; r++) {
        if (ids[r] < 0 || ids[r] >= n) return -1;
        const int lane = (int)(ids[r] % TILE);
        const uint8_t *p = packed + (ids[r] / TILE) * tile_bytes;
        for (int64_t s = 0; s < k / super_block; s++, p += super_bytes) {
            const float d = half_to_f32(p + 2 * lane);
            const float m = has_min ? half_to_f32(p + 2 * TILE + 2 * lane) : 0.0f;
            const uint8_t *sub_block = p + 2 * TILE * (has_min ? 2 : 1);
            for (int j = 0; j < super_block / sub; j++, sub_block += sb) {
                const uint8_t *codes = sub_block;
                float scale = d, low = m;
                if (has_scales) {
                    scale = d * (float)(int8_t)codes[lane];
                    codes += TILE;
                    if (has_min) {
                        low = m * (float)(int8_t)codes[lane];
                        codes += TILE;
                    }
                }
                float *row = out + r * k + s * super_block + j * sub;
                for (int i = 0; i < sub; i++) {
                    float v = scale * (float)(code_at(codes, &f, lane, i) - offset);
                    row[i] = has_min ? v - low : v;
                }
            }
        }
    }
    return 0;
}

#else

int qblock_gemm_available(void) { return 0; }

int qblock_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *packed,
                int64_t n, int bits, int sub, int super_block, int has_scales, int has_min,
                int offset, void *out, int out_bf16, int64_t out_stride) {
    (void)out_stride;
    (void)x; (void)x_bf16; (void)rows; (void)k; (void)packed; (void)n; (void)bits; (void)sub;
    (void)super_block; (void)has_scales; (void)has_min; (void)offset; (void)out; (void)out_bf16;
    return -1;
}

int qblock_rows(const uint8_t *packed, int64_t n, int64_t k, int bits, int sub, int super_block,
                int has_scales, int has_min, int offset, const int64_t *ids, int64_t count,
                float *out) {
    (void)packed; (void)n; (void)k; (void)bits; (void)sub; (void)super_block; (void)has_scales;
    (void)has_min; (void)offset; (void)ids; (void)count; (void)out;
    return -1;
}

#endif
