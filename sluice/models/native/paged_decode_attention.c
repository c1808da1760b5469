/* Decode attention straight over the paged KV cache: no gathered copy of K/V.
 *
 * For each decode sequence b and KV head h, the G = Hq / Hkv query heads of h
 * attend over the seq_lens[b] cached keys of b, read block by block through
 * the block table. Scores, softmax and the weighted sum of V are in float32
 * (the inputs' bfloat16 values are exact in float32); each output is rounded
 * once, to nearest even, to the model dtype.
 *
 * Layouts (row-major, contiguous):
 *   q        [num_seqs, num_heads, head_dim], sequence b's heads at q + b * q_stride
 *   cache    [2, num_blocks, block_size, num_kv_heads, head_dim]  (0 = K, 1 = V)
 *   block_ids[num_seqs, blocks_per_seq]   (padding past a sequence is never read)
 *   seq_lens [num_seqs]                   (1 <= seq_len <= blocks_per_seq * block_size)
 *   out      [num_seqs, num_heads, head_dim]
 * Query head q of KV head h is h * G + g, as in transformers' repeat_kv.
 * Returns 0, or -1 when a length or block id is out of range (nothing written
 * for that sequence then; the caller raises).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_load(const uint16_t *p) {
    uint32_t u = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void bf16_store(uint16_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        *p = (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    *p = (uint16_t)(u >> 16);
}

static inline float f32_load(const float *p) { return *p; }
static inline void f32_store(float *p, float f) { *p = f; }

#define MAX_HEAD_DIM 256

#define DEFINE_DECODE_ATTENTION(NAME, T, LOAD, STORE)                                          \
    int NAME(const T *q, const T *cache, const int64_t *block_ids, const int64_t *seq_lens,    \
             int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size, \
             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, T *out) { \
        if (head_dim > MAX_HEAD_DIM || num_kv_heads <= 0 || num_heads % num_kv_heads)          \
            return -1;                                                                         \
        const int64_t group = num_heads / num_kv_heads;                                       \
        const int64_t token_stride = num_kv_heads * head_dim;                                  \
        const int64_t v_offset = num_blocks * block_size * token_stride;                       \
        int64_t max_len = 0;                                                                   \
        for (int64_t b = 0; b < num_seqs; b++)                                                 \
            if (seq_lens[b] > max_len) max_len = seq_lens[b];                                  \
        float *scores = malloc(sizeof(float) * (size_t)(group * (max_len > 0 ? max_len : 1))); \
        if (scores == NULL) return -1;                                                         \
        int status = 0;                                                                        \
        for (int64_t b = 0; b < num_seqs; b++) {                                               \
            const int64_t len = seq_lens[b];                                                   \
            const int64_t *table = block_ids + b * blocks_per_seq;                             \
            if (len < 1 || len > blocks_per_seq * block_size) { status = -1; continue; }       \
            int is_valid = 1;                                                                  \
            for (int64_t i = 0; i < (len + block_size - 1) / block_size; i++)                  \
                if (table[i] < 0 || table[i] >= num_blocks) is_valid = 0;                      \
            if (!is_valid) { status = -1; continue; }                                          \
            for (int64_t h = 0; h < num_kv_heads; h++) {                                       \
                float qf[group][MAX_HEAD_DIM];                                                 \
                for (int64_t g = 0; g < group; g++) {                                          \
                    const T *qrow = q + b * q_stride + (h * group + g) * head_dim;             \
                    for (int64_t d = 0; d < head_dim; d++) qf[g][d] = LOAD(qrow + d) * scale;  \
                }                                                                              \
                /* Scores: each key row is read once for the G query heads. */                 \
                for (int64_t p = 0; p < len; p++) {                                            \
                    const int64_t slot = table[p / block_size] * block_size + p % block_size;  \
                    const T *krow = cache + slot * token_stride + h * head_dim;                \
                    float kf[MAX_HEAD_DIM];                                                    \
                    for (int64_t d = 0; d < head_dim; d++) kf[d] = LOAD(krow + d);             \
                    for (int64_t g = 0; g < group; g++) {                                      \
                        float s = 0.0f;                                                        \
                        for (int64_t d = 0; d < head_dim; d++) s += qf[g][d] * kf[d];          \
                        scores[g * len + p] = s;                                               \
                    }                                                                          \
                }                                                                              \
                /* Softmax per query head, then the weighted sum of V. */                      \
                float acc[group][MAX_HEAD_DIM];                                                \
                for (int64_t g = 0; g < group; g++) {                                          \
                    float *row = scores + g * len;                                             \
                    float top = row[0];                                                        \
                    for (int64_t p = 1; p < len; p++) if (row[p] > top) top = row[p];          \
                    float total = 0.0f;                                                        \
                    for (int64_t p = 0; p < len; p++) { row[p] = expf(row[p] - top);           \
                                                         total += row[p]; }                    \
                    const float inv = 1.0f / total;                                            \
                    for (int64_t p = 0; p < len; p++) row[p] *= inv;                           \
                    for (int64_t d = 0; d < head_dim; d++) acc[g][d] = 0.0f;                   \
                }                                                                              \
                for (int64_t p = 0; p < len; p++) {                                            \
                    const int64_t slot = table[p / block_size] * block_size + p % block_size;  \
                    const T *vrow = cache + v_offset + slot * token_stride + h * head_dim;     \
                    float vf[MAX_HEAD_DIM];                                                    \
                    for (int64_t d = 0; d < head_dim; d++) vf[d] = LOAD(vrow + d);             \
                    for (int64_t g = 0; g < group; g++) {                                      \
                        const float w = scores[g * len + p];                                   \
                        for (int64_t d = 0; d < head_dim; d++) acc[g][d] += w * vf[d];         \
                    }                                                                          \
                }                                                                              \
                for (int64_t g = 0; g < group; g++) {                                          \
                    T *orow = out + (b * num_heads + h * group + g) * head_dim;                \
                    for (int64_t d = 0; d < head_dim; d++) STORE(orow + d, acc[g][d]);         \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        free(scores);                                                                          \
        return status;                                                                         \
    }

DEFINE_DECODE_ATTENTION(decode_attention_bf16, uint16_t, bf16_load, bf16_store)
DEFINE_DECODE_ATTENTION(decode_attention_f32, float, f32_load, f32_store)
