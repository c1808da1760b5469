/* Matmul of int8-quantized activations by weights kept in their GGUF block
 * codes (sluice/loader/gguf_blocks.py), packed once at load
 * (sluice/models/qblock_pack.py) for AVX512-VNNI:
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
 * order. Nothing depends on how many rows share the call or how they are
 * blocked, so a row's bits are its own (the row-invariant default holds on
 * this path); the float steps are separate multiplies and adds (no FMA
 * contraction, see the pragma), so numpy's float32 reproduces them exactly.
 *
 * Integer order: with sub-block scales, A is sum_j SC_j * isum_j (one
 * multiply a sub-block) minus OFFSET * sum_j SC_j * xsum_j, and B and that
 * second sum are vpdpwssd dot products of SC or MN (int16 pairs of
 * neighbouring sub-blocks) with xsum pairs: the same integers, fewer steps.
 *
 * Activations are quantized once per call (per projection: `qblock_linear`
 * runs all of a fused projection's parts on one quantization), per row and
 * super-block, as llama.cpp's Q8_K/Q8_0 are: sx = amax / 127,
 * xq = rint(x * (127 / amax)).
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
 * Work: (row chunk, group of four tiles) items shared statically over
 * OpenMP's threads; inside one, rows four at a time times two tiles, so each
 * loaded weight vector serves four rows and each activation broadcast two
 * tiles; a row left over (one-stream decode) takes all four tiles at once:
 * four streams of codes in flight instead of two keep a core's loads ahead
 * of memory (~7-10% less CPU a byte for one row, the same for four and more).
 * Each tile's columns get the same operations in the same order either way. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"
#include "qblock_kernel.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

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

static __m512 load16_f32(const void *x, int x_bf16, int64_t index) {
    if (!x_bf16) return _mm512_loadu_ps((const float *)x + index);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + index));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* xq, sx for super-blocks of `super_block` (a multiple of 16): amax over the
 * block, rint(x * (127 / amax)) clamped to +-127, as the scalar code would. */
static void quantize_rows(const void *x, int x_bf16, activations *a) {
    const __m512 top = _mm512_set1_ps(127.0f), bottom = _mm512_set1_ps(-127.0f);
    const int64_t n_super = a->k / a->super_block;
    for (int64_t t = 0; t < a->rows; t++)
        for (int64_t s = 0; s < n_super; s++) {
            const int64_t base = t * a->k + s * a->super_block;
            __m512 amax = _mm512_setzero_ps();
            for (int i = 0; i < a->super_block; i += 16)
                amax = _mm512_max_ps(_mm512_abs_ps(load16_f32(x, x_bf16, base + i)), amax);
            const float m = _mm512_reduce_max_ps(amax);
            const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
            a->sx[t * n_super + s] = m / 127.0f;
            for (int i = 0; i < a->super_block; i += 16) {
                __m512 v = _mm512_mul_ps(load16_f32(x, x_bf16, base + i), inv);
                v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                v = _mm512_min_ps(_mm512_max_ps(v, bottom), top);
                _mm_storeu_si128((__m128i *)(a->xq + base + i),
                                 _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
            }
        }
}

/* xsum (and its int16 pairs) for sub-blocks of `sub`. */
static void sum_rows(activations *a) {
    const int64_t n_sub = a->k / a->sub;
    for (int64_t t = 0; t < a->rows; t++) {
        int32_t *xsum = a->xsum + t * n_sub;
        for (int64_t j = 0; j < n_sub; j++) {
            int32_t total = 0;
            for (int i = 0; i < a->sub; i++) total += a->xq[t * a->k + j * a->sub + i];
            xsum[j] = total;
        }
        for (int64_t p = 0; p < n_sub / 2; p++)
            a->xpair[t * (n_sub / 2) + p] =
                (int32_t)((uint32_t)(uint16_t)xsum[2 * p] | ((uint32_t)(uint16_t)xsum[2 * p + 1] << 16));
    }
}

/* Four activation codes in every lane: a load the multiply can take as its
 * broadcast operand (a memcpy into a register would cost two vector ops). */
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
static inline __m512i bcast4(const int8_t *p) {
    return _mm512_set1_epi32(*(const unaligned_i32 *)p);
}

/* One sub-block's codes (tile t's at codes[t]) times R rows' activations at k0:
 * isum[r][t] += sum_k xq[r] * q[t]. */
static inline __attribute__((always_inline)) void sub_block_sums(
    const qformat f, const int R, const int T, const uint8_t *const *codes,
    const int8_t *const *xq, int64_t k0, __m512i isum[ROW_GROUP][TILE_GROUP]) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (f.bits == 8) {
        for (int g = 0; g < f.sub / 4; g++)
            for (int r = 0; r < R; r++) {
                const __m512i x = bcast4(xq[r] + k0 + 4 * g);
                for (int t = 0; t < T; t++)
                    isum[r][t] = _mm512_dpbusd_epi32(isum[r][t], _mm512_loadu_si512(codes[t] + 64 * g), x);
            }
        return;
    }
    __m512i hb[TILE_GROUP];
    for (int g = 0; g < f.sub / 8; g++) {
        __m512i qa[TILE_GROUP], qb[TILE_GROUP];
        for (int t = 0; t < T; t++) {
            const uint8_t *high = codes[t] + (int64_t)TILE * f.sub / 2;
            __m512i v = _mm512_loadu_si512(codes[t] + 64 * g);
            qa[t] = _mm512_and_si512(v, low4);
            qb[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if (f.bits == 5) {
                if (g % 4 == 0) hb[t] = _mm512_loadu_si512(high + 64 * (g / 4));
                const __m512i bit4 = _mm512_set1_epi8(0x10);
                qa[t] = _mm512_or_si512(qa[t], _mm512_and_si512(_mm512_slli_epi16(hb[t], 4), bit4));
                qb[t] = _mm512_or_si512(qb[t], _mm512_and_si512(_mm512_slli_epi16(hb[t], 3), bit4));
                hb[t] = _mm512_srli_epi16(hb[t], 2);
            } else if (f.bits == 6) {
                if (g % 2 == 0) hb[t] = _mm512_loadu_si512(high + 64 * (g / 2));
                const __m512i bits45 = _mm512_set1_epi8(0x30);
                qa[t] = _mm512_or_si512(qa[t], _mm512_and_si512(_mm512_slli_epi16(hb[t], 4), bits45));
                qb[t] = _mm512_or_si512(qb[t], _mm512_and_si512(_mm512_slli_epi16(hb[t], 2), bits45));
                hb[t] = _mm512_srli_epi16(hb[t], 4);
            }
        }
        for (int r = 0; r < R; r++) {
            const __m512i xa = bcast4(xq[r] + k0 + 8 * g), xb = bcast4(xq[r] + k0 + 8 * g + 4);
            for (int t = 0; t < T; t++) {
                isum[r][t] = _mm512_dpbusd_epi32(isum[r][t], qa[t], xa);
                isum[r][t] = _mm512_dpbusd_epi32(isum[r][t], qb[t], xb);
            }
        }
    }
}

/* Sub-blocks j and j+1's int8 scales (SC or MN, at p and p + sb) as int16
 * pairs, one column a lane: the vpdpwssd operand for xsum pairs. */
static inline __m512i scale_pairs(const uint8_t *p, int64_t sb) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)p);
    const __m128i hi = _mm_loadu_si128((const __m128i *)(p + sb));
    const __m256i mixed = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    return _mm512_cvtepi8_epi16(mixed);
}

/* The correction sum_j S_j * xsum_j of one super-block (S: SC or MN, `at`
 * bytes into each sub-block), for R rows and T tiles. */
static inline __attribute__((always_inline)) void pair_sums(
    const qformat f, const int R, const int T, const uint8_t *const *heads, int64_t at,
    const int32_t *const *xpair, int64_t p0, __m512i out[ROW_GROUP][TILE_GROUP]) {
    const int64_t sb = sub_bytes(&f);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[r][t] = _mm512_setzero_si512();
    for (int p = 0; p < f.super_block / f.sub / 2; p++) {
        __m512i w[TILE_GROUP];
        for (int t = 0; t < T; t++) w[t] = scale_pairs(heads[t] + 2 * p * sb + at, sb);
        for (int r = 0; r < R; r++) {
            const __m512i xs = _mm512_set1_epi32(xpair[r][p0 + p]);
            for (int t = 0; t < T; t++) out[r][t] = _mm512_dpwssd_epi32(out[r][t], w[t], xs);
        }
    }
}

/* Rows r0..r0+R times tiles t0..t0+T, whole k: out[r, tile columns]. */
static inline __attribute__((always_inline)) void block_rows(
    const qformat f, const int R, const int T, const job *jb, int64_t r0, int64_t t0) {
    const activations *act = jb->act;
    const int64_t k = act->k, n_super = k / f.super_block, n_sub = k / f.sub;
    const int per_super = f.super_block / f.sub;
    const int64_t sb = sub_bytes(&f);
    const int64_t super_bytes = qblock_super_bytes(f.bits, f.sub, f.super_block, f.has_scales, f.has_min);
    const int64_t head = 2 * TILE * (f.has_min ? 2 : 1);
    const int64_t scale_bytes = f.has_scales ? TILE * (f.has_min ? 2 : 1) : 0;
    const int8_t *xq[ROW_GROUP];
    const int32_t *xsum[ROW_GROUP], *xpair[ROW_GROUP];
    for (int r = 0; r < R; r++) {
        xq[r] = act->xq + (r0 + r) * k;
        xsum[r] = act->xsum + (r0 + r) * n_sub;
        xpair[r] = act->xpair + (r0 + r) * (n_sub / 2);
    }
    __m512 acc[ROW_GROUP][TILE_GROUP];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n_super; s++) {
        const uint8_t *heads[TILE_GROUP], *codes[TILE_GROUP];
        __m512 d[TILE_GROUP], m[TILE_GROUP];
        for (int t = 0; t < T; t++) {
            const uint8_t *p = jb->packed + (t0 + t) * jb->tile_bytes + s * super_bytes;
            d[t] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
            if (f.has_min) m[t] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * TILE)));
            heads[t] = p + head;
        }
        __m512i a[ROW_GROUP][TILE_GROUP], b[ROW_GROUP][TILE_GROUP];
        for (int j = 0; j < per_super; j++) {
            __m512i isum[ROW_GROUP][TILE_GROUP];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) isum[r][t] = _mm512_setzero_si512();
            for (int t = 0; t < T; t++) codes[t] = heads[t] + j * sb + scale_bytes;
            sub_block_sums(f, R, T, codes, xq, (s * per_super + j) * f.sub, isum);
            for (int t = 0; t < T; t++) {
                const __m512i sc = f.has_scales
                    ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(heads[t] + j * sb)))
                    : _mm512_setzero_si512();
                for (int r = 0; r < R; r++) {
                    const __m512i term = f.has_scales ? _mm512_mullo_epi32(sc, isum[r][t]) : isum[r][t];
                    a[r][t] = j == 0 ? term : _mm512_add_epi32(a[r][t], term);
                }
            }
        }
        if (f.has_scales && (f.has_min || f.offset)) {
            /* B (MN) or the offset's sum (SC), as dot products over xsum pairs. */
            pair_sums(f, R, T, heads, f.has_min ? TILE : 0, xpair, s * per_super / 2, b);
            if (f.offset)
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++)
                        a[r][t] = _mm512_sub_epi32(a[r][t], _mm512_mullo_epi32(b[r][t], _mm512_set1_epi32(f.offset)));
        } else if (!f.has_scales) {
            for (int r = 0; r < R; r++) {
                const __m512i xs = _mm512_set1_epi32(xsum[r][s]);
                for (int t = 0; t < T; t++) {
                    if (f.offset)
                        a[r][t] = _mm512_sub_epi32(a[r][t], _mm512_mullo_epi32(xs, _mm512_set1_epi32(f.offset)));
                    b[r][t] = xs;
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const __m512 scale = _mm512_set1_ps(act->sx[(r0 + r) * n_super + s]);
            for (int t = 0; t < T; t++) {
                __m512 v = _mm512_mul_ps(d[t], _mm512_cvtepi32_ps(a[r][t]));
                if (f.has_min) v = _mm512_sub_ps(v, _mm512_mul_ps(m[t], _mm512_cvtepi32_ps(b[r][t])));
                acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_mul_ps(v, scale));
            }
        }
    }
    for (int t = 0; t < T; t++) {
        const int64_t col = (t0 + t) * TILE;
        const int64_t width = jb->n - col < TILE ? jb->n - col : TILE;
        const __mmask16 keep = (__mmask16)((1u << width) - 1u);
        for (int r = 0; r < R; r++) {
            const int64_t at = (r0 + r) * jb->out_stride + col;
            if (!jb->out_bf16) {
                _mm512_mask_storeu_ps((float *)jb->out + at, keep, acc[r][t]);
                continue;
            }
            /* bf16.h's rounding: nearest even, NaN stays a quiet NaN. */
            const __m512i u = _mm512_castps_si512(acc[r][t]);
            __m512i rounded = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
            rounded = _mm512_add_epi32(rounded, _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                          _mm512_set1_epi32(0x7f800000));
            rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
            _mm256_mask_storeu_epi16((uint16_t *)jb->out + at, keep,
                                     _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
        }
    }
}

/* R rows times `tiles` tiles from t0, ROW_TILES at a time (one where a
 * count is odd). */
static inline __attribute__((always_inline)) void row_tiles(const qformat f, const int R, const job *jb,
                                                            int64_t r0, int64_t t0, int tiles) {
    for (int t = 0; t < tiles; t += ROW_TILES) {
        if (tiles - t >= ROW_TILES) block_rows(f, R, ROW_TILES, jb, r0, t0 + t);
        else block_rows(f, R, 1, jb, r0, t0 + t);
    }
}

/* One format's kernel, its row and tile counts constants (registers,
 * unrolled loops): a full group of rows ROW_TILES tiles at a time, else one
 * row at a time: over the whole group of tiles where at most WIDE rows are
 * left (the formats with high bits, Q5/Q6, hold more registers a tile: four
 * tiles were slower for them from 2 rows, faster for 1), else ROW_TILES at a
 * time. Few instances keep the build (and its sanitized one) quick. */
#define FORMAT_KERNEL(NAME, B, SUB, SUPER, SC, MIN, OFF, WIDE)                             \
    static void block_##NAME(const job *jb, int64_t r0, int rows, int64_t t0, int tiles) { \
        const qformat f = {B, SUB, SUPER, SC, MIN, OFF};                                   \
        if (rows == ROW_GROUP) {                                                           \
            row_tiles(f, ROW_GROUP, jb, r0, t0, tiles);                                    \
            return;                                                                        \
        }                                                                                  \
        const int wide = tiles == TILE_GROUP && rows <= (WIDE);                            \
        for (int r = 0; r < rows; r++) {                                                   \
            if (wide) block_rows(f, 1, TILE_GROUP, jb, r0 + r, t0);                        \
            else row_tiles(f, 1, jb, r0 + r, t0, tiles);                                   \
        }                                                                                  \
    }

FORMAT_KERNEL(q4_k, 4, 32, 256, 1, 1, 0, 3)
FORMAT_KERNEL(q5_k, 5, 32, 256, 1, 1, 0, 1)
FORMAT_KERNEL(q6_k, 6, 16, 256, 1, 0, 32, 1)
FORMAT_KERNEL(q4_0, 4, 32, 32, 0, 0, 8, 3)
FORMAT_KERNEL(q4_1, 4, 32, 32, 0, 1, 0, 3)
FORMAT_KERNEL(q5_0, 5, 32, 32, 0, 0, 16, 1)
FORMAT_KERNEL(q5_1, 5, 32, 32, 0, 1, 0, 1)
FORMAT_KERNEL(q8_0, 8, 32, 32, 0, 0, 128, 3)

block_fn qblock_kernel_for(const QBlockPart *p) {
#define MATCH(NAME, B, SUB, SUPER, SC, MIN, OFF)                                              \
    if (p->bits == B && p->sub == SUB && p->super_block == SUPER && p->has_scales == SC &&   \
        p->has_min == MIN && p->offset == OFF)                                               \
        return block_##NAME;
    MATCH(q4_k, 4, 32, 256, 1, 1, 0)
    MATCH(q5_k, 5, 32, 256, 1, 1, 0)
    MATCH(q6_k, 6, 16, 256, 1, 0, 32)
    MATCH(q4_0, 4, 32, 32, 0, 0, 8)
    MATCH(q4_1, 4, 32, 32, 0, 1, 0)
    MATCH(q5_0, 5, 32, 32, 0, 0, 16)
    MATCH(q5_1, 5, 32, 32, 0, 1, 0)
    MATCH(q8_0, 8, 32, 32, 0, 0, 128)
#undef MATCH
    return NULL;
}

/* Rows [r0, end) times the tile group at t0 (one work item). */
static void run_rows(block_fn kernel, const job *jb, int64_t r0, int64_t end, int64_t t0) {
    const int64_t tiles = (jb->n + TILE - 1) / TILE;
    const int count_t = tiles - t0 < TILE_GROUP ? (int)(tiles - t0) : TILE_GROUP;
    for (; r0 < end; r0 += ROW_GROUP) {
        const int count_r = end - r0 < ROW_GROUP ? (int)(end - r0) : ROW_GROUP;
        kernel(jb, r0, count_r, t0, count_t);
    }
}

void qblock_run_spans(block_fn kernel, const span *spans, int64_t count, int64_t n) {
    const int64_t groups = qblock_tile_groups(n);
    int64_t one[2], *first_item = count == 1 ? one : malloc(sizeof(int64_t) * (size_t)(count + 1));
    if (first_item == NULL) { /* no memory for the index: the spans one after another */
        for (int64_t s = 0; s < count; s++) qblock_run_spans(kernel, &spans[s], 1, n);
        return;
    }
    first_item[0] = 0;
    for (int64_t s = 0; s < count; s++)
        first_item[s + 1] = first_item[s] + (spans[s].end - spans[s].start + ROW_CHUNK - 1) / ROW_CHUNK * groups;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < first_item[count]; item++) {
        int64_t s = 0;
        while (first_item[s + 1] <= item) s++;
        const int64_t local = item - first_item[s], r0 = spans[s].start + local / groups * ROW_CHUNK;
        const int64_t end = r0 + ROW_CHUNK < spans[s].end ? r0 + ROW_CHUNK : spans[s].end;
        run_rows(kernel, &spans[s].jb, r0, end, (local % groups) * TILE_GROUP);
    }
    if (first_item != one) free(first_item);
}

int qblock_activations_alloc(activations *a, int64_t rows, int64_t k) {
    *a = (activations){rows, k, 0, 0, NULL, NULL, NULL, NULL};
    a->xq = malloc((size_t)(rows * k) + 1);
    a->sx = malloc(sizeof(float) * (size_t)(rows * (k / 16) + 1));
    a->xsum = malloc(sizeof(int32_t) * (size_t)(rows * (k / 16) + 1));
    a->xpair = malloc(sizeof(int32_t) * (size_t)(rows * (k / 32) + 1));
    if (a->xq && a->sx && a->xsum && a->xpair) return 0;
    qblock_activations_free(a);
    return -1;
}

void qblock_activations_free(activations *a) {
    free(a->xpair);
    free(a->xsum);
    free(a->sx);
    free(a->xq);
    a->xq = NULL, a->sx = NULL, a->xsum = NULL, a->xpair = NULL;
}

block_fn qblock_prepare(const void *x, int x_bf16, activations *a, const QBlockPart *p, void *out,
                        int out_bf16, int64_t out_stride, job *jb) {
    const block_fn kernel = qblock_kernel_for(p);
    if (kernel == NULL || a->k % p->super_block != 0) return NULL;
    if (a->super_block != p->super_block) {
        a->super_block = (int)p->super_block;
        a->sub = 0;
        quantize_rows(x, x_bf16, a);
    }
    if (a->sub != p->sub) {
        a->sub = (int)p->sub;
        sum_rows(a);
    }
    const int64_t super_bytes = qblock_super_bytes((int)p->bits, (int)p->sub, (int)p->super_block,
                                                   (int)p->has_scales, (int)p->has_min);
    *jb = (job){p->packed, p->out_features, (a->k / p->super_block) * super_bytes, a, out, out_bf16,
                out_stride};
    return kernel;
}

/* out[rows, sum of parts' n] = x[rows, k] W^T for W the parts' rows one
 * after another (a fused projection: q, k, v; gate, up), each part into its
 * column slice; out's rows `out_stride` elements apart. x and out are
 * float32, or bfloat16 where the flags say so. The rows are quantized once
 * per super-block size the parts use (Q4_K_M's Q4_K and Q6_K share one).
 * Returns 0, or -1 for a format it has no kernel for or no memory. */
int qblock_linear(const void *x, int x_bf16, int64_t rows, int64_t k, const QBlockPart *parts,
                  int64_t num_parts, void *out, int out_bf16, int64_t out_stride) {
    activations act;
    int status = qblock_activations_alloc(&act, rows, k);
    const int64_t element = out_bf16 ? 2 : 4;
    int64_t column = 0;
    for (int64_t i = 0; i < num_parts && status == 0; i++) {
        span one = {.start = 0, .end = rows};
        const block_fn kernel = qblock_prepare(x, x_bf16, &act, &parts[i], (char *)out + column * element,
                                               out_bf16, out_stride, &one.jb);
        if (kernel == NULL) {
            status = -1;
            break;
        }
        qblock_run_spans(kernel, &one, 1, parts[i].out_features);
        column += parts[i].out_features;
    }
    qblock_activations_free(&act);
    return status;
}

/* One matrix's qblock_linear. */
int qblock_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *packed,
                int64_t n, int bits, int sub, int super_block, int has_scales, int has_min,
                int offset, void *out, int out_bf16, int64_t out_stride) {
    const QBlockPart part = {packed, n, bits, sub, super_block, has_scales, has_min, offset};
    return qblock_linear(x, x_bf16, rows, k, &part, 1, out, out_bf16, out_stride);
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

int qblock_linear(const void *x, int x_bf16, int64_t rows, int64_t k, const QBlockPart *parts,
                  int64_t num_parts, void *out, int out_bf16, int64_t out_stride) {
    (void)x; (void)x_bf16; (void)rows; (void)k; (void)parts; (void)num_parts; (void)out;
    (void)out_bf16; (void)out_stride;
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
