/* Causal attention of a prefill chunk, bfloat16, with AVX512-BF16: query i
 * (at position offset + i of its sequence) attends to keys 0..offset + i.
 * The chunk's own keys are the last num_queries of the num_keys given, so
 * one call covers a whole prompt (offset 0) and a chunk behind cached
 * context alike, and no step of keys that every query of a block masks is
 * computed.
 *
 * Flash attention in fixed key blocks (avx512_attention.h): per (query head,
 * block of 8 queries), keys in steps of 32 at absolute positions, an online
 * softmax per row, float32 accumulators, both products on vdpbf16ps. Every
 * row runs through avx512_attention.c's step, as paged_decode_attention.c's
 * rows do: a query gets the same bits in any chunk, beside any other
 * queries, and as a decode row (issue 44). Keys and values are packed once
 * per call per KV head, step by step, into that file's layouts.
 * torch's CPU flash kernel ran at about 100 GFLOPS on the embedded model's
 * heads (64 dimensions), a quarter of its bfloat16 matmuls' rate, and was
 * about half of a 2,000-token prompt's prefill.
 *
 * Layouts: q [num_queries, num_heads, head_dim] with q_stride elements
 * between tokens; k and v [num_keys, num_kv_heads, head_dim] with k_stride
 * and v_stride between tokens; out [num_queries, num_heads, head_dim] contiguous. Heads
 * and dimensions contiguous; head_dim 64 or 128; query head h reads KV head
 * h / (num_heads / num_kv_heads).
 *
 * Returns 0; -1 (nothing written) for an unsupported shape or no memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "sluice_abi.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include "avx512_attention.h"

#define ROWS AVX_ROWS /* queries per block */

int prefill_attention_available(void) { return 1; }

/* One KV head's keys and values, step by step, into avx512_attention.c's
 * layouts (zero past num_keys). */
static void pack_head(const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                      int64_t num_keys, int64_t head_dim, uint32_t *kp, uint32_t *vp) {
    const int64_t steps = (num_keys + AVX_STEP_KEYS - 1) / AVX_STEP_KEYS;
    const int64_t words = avx_step_words(head_dim);
    for (int64_t step = 0; step < steps; step++) {
        const uint16_t *key_rows[AVX_STEP_KEYS], *value_rows[AVX_STEP_KEYS];
        for (int64_t i = 0; i < AVX_STEP_KEYS; i++) {
            const int64_t key = step * AVX_STEP_KEYS + i;
            key_rows[i] = key < num_keys ? k + key * k_stride : NULL;
            value_rows[i] = key < num_keys ? v + key * v_stride : NULL;
        }
        avx_pack_step(key_rows, value_rows, head_dim, kp + step * words, vp + step * words);
    }
}

/* One block of `rows` (<= ROWS) queries of one head: the steps up to the
 * block's last query's position, each row updated only by the steps it sees. */
static void attend_block(const uint16_t *q, int64_t q_stride, const uint32_t *kp,
                         const uint32_t *vp, int64_t first, int64_t rows, int64_t offset,
                         int64_t head_dim, float scale, uint16_t *out, int64_t out_stride) {
    struct avx_rows state;
    avx_rows_start(&state, rows, head_dim, q + first * q_stride, q_stride, offset + first, 1);
    const int64_t steps = (offset + first + rows - 1) / AVX_STEP_KEYS + 1;
    const int64_t words = avx_step_words(head_dim);
    for (int64_t step = 0; step < steps; step++)
        avx_rows_step(&state, kp + step * words, vp + step * words, step, scale);
    avx_rows_finish(&state, out + first * out_stride, out_stride);
}

int prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                           int64_t k_stride, const uint16_t *v, int64_t v_stride,
                           int64_t num_queries,
                           int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, float scale, uint16_t *out) {
    if ((head_dim != 64 && head_dim != 128) || num_kv_heads <= 0 || num_heads % num_kv_heads ||
        num_queries < 1 || num_keys < num_queries)
        return -1;
    const int64_t offset = num_keys - num_queries, group = num_heads / num_kv_heads;
    const int64_t steps = (num_keys + AVX_STEP_KEYS - 1) / AVX_STEP_KEYS;
    const int64_t head_words = steps * avx_step_words(head_dim); /* uint32 pairs per head, K or V */
    uint32_t *kp = malloc(sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    uint32_t *vp = malloc(sizeof(uint32_t) * (size_t)(head_words * num_kv_heads));
    if (kp == NULL || vp == NULL) {
        free(kp);
        free(vp);
        return -1;
    }
    const int64_t blocks = (num_queries + ROWS - 1) / ROWS;
    const int64_t out_stride = num_heads * head_dim;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t h = 0; h < num_kv_heads; h++)
            pack_head(k + h * head_dim, k_stride, v + h * head_dim, v_stride, num_keys, head_dim,
                      kp + h * head_words, vp + h * head_words);
        /* Later blocks see more keys: hand them out first, one at a time. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < blocks * num_heads; task++) {
            const int64_t block = blocks - 1 - task / num_heads, h = task % num_heads;
            const int64_t first = block * ROWS;
            const int64_t rows = num_queries - first < ROWS ? num_queries - first : ROWS;
            const int64_t kv = h / group;
            attend_block(q + h * head_dim, q_stride, kp + kv * head_words, vp + kv * head_words,
                         first, rows, offset, head_dim, scale, out + h * head_dim, out_stride);
        }
    }
    free(kp);
    free(vp);
    return 0;
}

#else /* no AVX512-BF16: the caller keeps torch's flash attention */

int prefill_attention_available(void) { return 0; }
int prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                           int64_t k_stride, const uint16_t *v, int64_t v_stride,
                           int64_t num_queries,
                           int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, float scale, uint16_t *out) {
    (void)q; (void)q_stride; (void)k; (void)k_stride; (void)v; (void)v_stride;
    (void)num_queries;
    (void)num_keys; (void)num_heads; (void)num_kv_heads; (void)head_dim; (void)scale; (void)out;
    return -1;
}

#endif
