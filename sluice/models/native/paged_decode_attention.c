/* Decode attention straight over the paged KV cache: no gathered copy of K/V.
 *
 * For each decode sequence b and KV head h, the G = Hq / Hkv query heads of h
 * attend over the seq_lens[b] cached keys of b, read block by block through
 * the block table. Scores, softmax and the weighted sum of V are in float32
 * (the inputs' bfloat16 values are exact in float32); each output is rounded
 * once, to nearest even, to the model dtype.
 *
 * Layouts (row-major, contiguous unless said):
 *   q        [num_seqs, num_heads, head_dim], sequence b's heads at q + b * q_stride
 *   cache    [2, num_blocks, block_size, num_kv_heads, head_dim]  (0 = K, 1 = V)
 *   block_ids[num_seqs, blocks_per_seq]   (padding past a sequence is never read)
 *   seq_lens [num_seqs]                   (1 <= seq_len <= blocks_per_seq * block_size)
 *   out      [num_seqs, num_heads, head_dim]
 * Query head q of KV head h is h * G + g, as in transformers' repeat_kv.
 *
 * The (sequence, KV head) pairs are shared out over OpenMP threads. Built with
 * -fopenmp, this library links libgomp.so.1 by name, which in a process that
 * imported torch is torch's own copy: one thread pool, sized by
 * torch.set_num_threads, not a second one competing for the cores.
 *
 * Returns 0, or -1 (nothing written) when a length or block id is out of range
 * or the head layout is unsupported; the caller raises.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16
/* Fewer (sequence, KV head) pairs than this run on the calling thread. */
#define MIN_PARALLEL_PAIRS 8

static int check_tables(const int64_t *block_ids, const int64_t *seq_lens, int64_t num_seqs,
                        int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size) {
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t len = seq_lens[b];
        if (len < 1 || len > blocks_per_seq * block_size) return -1;
        for (int64_t i = 0; i < (len + block_size - 1) / block_size; i++) {
            const int64_t block = block_ids[b * blocks_per_seq + i];
            if (block < 0 || block >= num_blocks) return -1;
        }
    }
    return 0;
}

/* One (sequence, KV head) pair: `scores` holds group * len floats. */
#define DEFINE_ATTEND_ONE(NAME, T, LOAD, STORE)                                                \
    static void NAME(const T *q, const T *keys, const T *values, const int64_t *table,         \
                     int64_t len, int64_t block_size, int64_t token_stride, int64_t group,     \
                     int64_t head_dim, float scale, T *out, float *scores) {                   \
        float qf[MAX_GROUP][MAX_HEAD_DIM];                                                     \
        for (int64_t g = 0; g < group; g++)                                                    \
            for (int64_t d = 0; d < head_dim; d++) qf[g][d] = LOAD(q + g * head_dim + d) * scale; \
        /* Scores: each key row is read once for the G query heads; keys are */                \
        /* walked block by block (no division per key). */                                     \
        for (int64_t start = 0; start < len; start += block_size) {                            \
            const T *krow = keys + table[start / block_size] * block_size * token_stride;      \
            const int64_t end = start + block_size < len ? start + block_size : len;           \
            for (int64_t p = start; p < end; p++, krow += token_stride) {                      \
                float kf[MAX_HEAD_DIM];                                                        \
                for (int64_t d = 0; d < head_dim; d++) kf[d] = LOAD(krow + d);                 \
                for (int64_t g = 0; g < group; g++) {                                          \
                    float s = 0.0f;                                                            \
                    for (int64_t d = 0; d < head_dim; d++) s += qf[g][d] * kf[d];              \
                    scores[g * len + p] = s;                                                   \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        /* Softmax per query head. */                                                          \
        for (int64_t g = 0; g < group; g++) {                                                  \
            float *row = scores + g * len;                                                     \
            float top = row[0];                                                                \
            for (int64_t p = 1; p < len; p++)                                                  \
                if (row[p] > top) top = row[p];                                                \
            float total = 0.0f;                                                                \
            for (int64_t p = 0; p < len; p++) {                                                \
                row[p] = expf(row[p] - top);                                                   \
                total += row[p];                                                               \
            }                                                                                  \
            const float inv = 1.0f / total;                                                    \
            for (int64_t p = 0; p < len; p++) row[p] *= inv;                                   \
        }                                                                                      \
        /* The weighted sum of V, each value row read once. */                                 \
        float acc[MAX_GROUP][MAX_HEAD_DIM];                                                    \
        for (int64_t g = 0; g < group; g++)                                                    \
            for (int64_t d = 0; d < head_dim; d++) acc[g][d] = 0.0f;                           \
        for (int64_t start = 0; start < len; start += block_size) {                            \
            const T *vrow = values + table[start / block_size] * block_size * token_stride;    \
            const int64_t end = start + block_size < len ? start + block_size : len;           \
            for (int64_t p = start; p < end; p++, vrow += token_stride) {                      \
                float vf[MAX_HEAD_DIM];                                                        \
                for (int64_t d = 0; d < head_dim; d++) vf[d] = LOAD(vrow + d);                 \
                for (int64_t g = 0; g < group; g++) {                                          \
                    const float w = scores[g * len + p];                                       \
                    for (int64_t d = 0; d < head_dim; d++) acc[g][d] += w * vf[d];             \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int64_t g = 0; g < group; g++)                                                    \
            for (int64_t d = 0; d < head_dim; d++) STORE(out + g * head_dim + d, acc[g][d]);   \
    }

#define DEFINE_DECODE_ATTENTION(NAME, ATTEND, T)                                                \
    int NAME(const T *q, const T *cache, const int64_t *block_ids, const int64_t *seq_lens,     \
             int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq, int64_t num_blocks,    \
             int64_t block_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,     \
             float scale, T *out) {                                                             \
        if (head_dim > MAX_HEAD_DIM || num_kv_heads <= 0 || num_heads % num_kv_heads ||         \
            num_heads / num_kv_heads > MAX_GROUP)                                               \
            return -1;                                                                          \
        if (check_tables(block_ids, seq_lens, num_seqs, blocks_per_seq, num_blocks, block_size)) \
            return -1;                                                                          \
        const int64_t group = num_heads / num_kv_heads;                                        \
        const int64_t token_stride = num_kv_heads * head_dim;                                   \
        const T *values = cache + num_blocks * block_size * token_stride;                       \
        const int64_t num_pairs = num_seqs * num_kv_heads;                                      \
        int status = 0;                                                                         \
        _Pragma("omp parallel for schedule(dynamic, 1) if (num_pairs >= MIN_PARALLEL_PAIRS)")  \
        for (int64_t pair = 0; pair < num_pairs; pair++) {                                      \
            const int64_t b = pair / num_kv_heads, h = pair % num_kv_heads;                     \
            const int64_t len = seq_lens[b];                                                    \
            float *scores = malloc(sizeof(float) * (size_t)(group * len));                      \
            if (scores == NULL) {                                                               \
                _Pragma("omp atomic write") status = -1;                                        \
                continue;                                                                       \
            }                                                                                   \
            ATTEND(q + b * q_stride + h * group * head_dim, cache + h * head_dim,               \
                   values + h * head_dim, block_ids + b * blocks_per_seq, len, block_size,      \
                   token_stride, group, head_dim, scale,                                        \
                   out + (b * num_heads + h * group) * head_dim, scores);                       \
            free(scores);                                                                       \
        }                                                                                       \
        return status;                                                                          \
    }

DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, bf16_load, bf16_store)
DEFINE_ATTEND_ONE(attend_one_f32, float, f32_load, f32_store)
DEFINE_DECODE_ATTENTION(decode_attention_bf16, attend_one_bf16, uint16_t)
DEFINE_DECODE_ATTENTION(decode_attention_f32, attend_one_f32, float)
