/* The fixed key blocks of the AVX512-BF16 attention kernels (avx512_attention.c):
 * prefill_attention.c and paged_decode_attention.c's bfloat16 path both run
 * every query row through these functions, so a row's bits depend only on
 * its own q, its position and the keys and values at positions up to it:
 * not on the chunk it was computed in, the rows beside it, or whether a
 * prefill or a decode step computed it (issue 44).
 *
 * The scheme, per query row:
 *   - keys are visited in steps of AVX_STEP_KEYS (32) at absolute positions:
 *     step s holds keys [32 s, 32 s + 32) of the sequence, in ascending s;
 *     a step in which the row sees no key leaves its state untouched, and
 *     keys after the row's position are masked (score -inf, weight 0);
 *   - scores: 16 keys a vector, vdpbf16ps over the dimension pairs in order
 *     (keys packed [tile of 16][dim pair][16 keys], avx_pack_step), times the
 *     scale; one online-softmax update per step (running maximum and sum,
 *     exp16 of vector_exp.h), the probabilities rounded to bfloat16 and
 *     weighed with the values by vdpbf16ps over key pairs in order (values
 *     packed [key pair][dim chunk][16 dims]), two partial sums (even and odd
 *     key pairs) added at the end of each step;
 *   - the output is the float32 sum times 1 / the row's total, rounded once.
 * The step and finish functions are compiled once, here, and called by both
 * kernels (not inlined into each: -ffast-math may not then round a row in
 * two ways). A lane past the sequence is packed as zero; a masked lane of a
 * prefill step holds a later key, whose weight 0 adds nothing (up to the
 * sign of a sum that is exactly zero).
 *
 * Include only where the compiler targets AVX512F and AVX512-BF16. */
#ifndef SLUICE_AVX512_ATTENTION_H
#define SLUICE_AVX512_ATTENTION_H

#include <stdint.h>

#include <immintrin.h>

#define AVX_TILE_KEYS 16 /* keys per vector of scores */
#define AVX_STEP_KEYS 32 /* keys per step: two tiles, at fixed absolute positions */
#define AVX_ROWS 8       /* query rows one state holds */
#define AVX_MAX_DIM 128  /* head sizes: 64 and 128 */

/* Up to AVX_ROWS query rows that read the same keys, each with its own state. */
struct avx_rows {
    __m512 o[AVX_ROWS][AVX_MAX_DIM / 16]; /* unnormalised outputs, float32 */
    float top[AVX_ROWS];                  /* running maxima of the scaled scores */
    float total[AVX_ROWS];                /* running softmax denominators */
    const uint16_t *q[AVX_ROWS];          /* each row's query [head_dim] */
    int64_t limit[AVX_ROWS];              /* each row's last visible key position */
    int64_t rows;                         /* rows in use, 1..AVX_ROWS */
    int64_t head_dim;                     /* 64 or 128 */
};

/* Packed uint32 words of one step's keys, or of its values (the same count). */
static inline int64_t avx_step_words(int64_t head_dim) { return AVX_STEP_KEYS * head_dim / 2; }

/* Rows r = 0..rows-1: query q0 + r * q_stride, last visible key limit0 + r * limit_step. */
void avx_rows_start(struct avx_rows *s, int64_t rows, int64_t head_dim, const uint16_t *q0,
                    int64_t q_stride, int64_t limit0, int64_t limit_step)
    __attribute__((visibility("hidden")));

/* Pack one step's keys and values: key_rows[i] / value_rows[i] is key
 * 32 s + i's row of head_dim values of one KV head, or NULL past the
 * sequence (packed as zero). kp and vp hold avx_step_words(head_dim) each. */
void avx_pack_step(const uint16_t *const *key_rows, const uint16_t *const *value_rows,
                   int64_t head_dim, uint32_t *kp, uint32_t *vp)
    __attribute__((visibility("hidden")));

/* Step `step` (keys [32 step, 32 step + 32)) of every row, from its packed keys and values. */
void avx_rows_step(struct avx_rows *s, const uint32_t *kp, const uint32_t *vp, int64_t step,
                   float scale) __attribute__((visibility("hidden")));

/* Row r's output, rounded to bfloat16, at out0 + r * out_stride. */
void avx_rows_finish(const struct avx_rows *s, uint16_t *out0, int64_t out_stride)
    __attribute__((visibility("hidden")));

#endif
