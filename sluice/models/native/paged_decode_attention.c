/* Decode attention straight over the paged KV cache: no gathered copy of K/V.
 *
 * For each decode sequence b and KV head h, the G = Hq / Hkv query heads of h
 * attend over the seq_lens[b] cached keys of b, read block by block through
 * the block table. Scores, softmax and the weighted sum of V are in float32
 * (the inputs' bfloat16 values are exact in float32); each output is rounded
 * once, to nearest even, to the model dtype. Bfloat16 heads of 64 and 128
 * take prefill_attention.c's fixed key blocks instead (below), so a decode
 * row gets the bits its query gets in any prefill chunk (issue 44).
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

#include "sluice_abi.h"
#include "bf16.h"
#include "paged_tables.h"
#include "vector_exp.h"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16
/* Fewer (sequence, KV head) pairs than this run on the calling thread. */
#define MIN_PARALLEL_PAIRS 8

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


#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* The bfloat16 path on CPUs with AVX512-BF16, for heads of 64 or 128: the
 * fixed key blocks of avx512_attention.h. A decode row of a sequence of L
 * keys is the query at position L - 1 of a prefill over those keys, and it
 * runs through the same compiled step as prefill_attention.c's rows, over
 * the same packed layouts (keys in steps of 32 at absolute positions): so it
 * gets exactly the bits that query gets in any prefill chunk (issue 44). A
 * token an agent's turn decoded and its next turn sends back as prompt then
 * has the same K/V both times, and so does every layer after.
 *
 * Each step's 32 keys and values of a KV head are packed as they are read
 * from the paged cache (a 16 x 16 transpose, an interleave), once for the
 * G query heads that read them (a state of up to 8 rows per 8 query heads),
 * and the next step's rows are prefetched meanwhile. */
#include <immintrin.h>

#include "avx512_attention.h"

/* Row states one task keeps (its KV heads times ceil(G / 8)). */
#define MAX_TASK_STATES 8

/* KV heads [h0, h0 + nh) of one sequence of len keys. A task takes several
 * KV heads of its sequence when there are enough sequences to go round the
 * threads: then a token's keys (and values) for all its heads are one
 * contiguous read, where one head's rows alone are a third of each stretch
 * of memory (measured: the hardware prefetcher then fetched much that no
 * one read). */
static void attend_task_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                             const int64_t *table, int64_t len, int64_t block_size,
                             int64_t token_stride, int64_t group, int64_t head_dim, int64_t h0,
                             int64_t nh, float scale, uint16_t *out) {
    const int64_t per_head = (group + AVX_ROWS - 1) / AVX_ROWS;
    struct avx_rows states[MAX_TASK_STATES];
    for (int64_t h = 0; h < nh; h++)
        for (int64_t part = 0; part < per_head; part++) {
            const int64_t first = part * AVX_ROWS;
            const int64_t rows = group - first < AVX_ROWS ? group - first : AVX_ROWS;
            avx_rows_start(&states[h * per_head + part], rows, head_dim,
                           q + (h * group + first) * head_dim, head_dim, len - 1, 0);
        }
    uint32_t kp[AVX_STEP_KEYS * AVX_MAX_DIM / 2] __attribute__((aligned(64)));
    uint32_t vp[AVX_STEP_KEYS * AVX_MAX_DIM / 2] __attribute__((aligned(64)));
    const int64_t span_bytes = nh * head_dim * (int64_t)sizeof(uint16_t);
    keys += h0 * head_dim;
    values += h0 * head_dim;
    int64_t here[AVX_STEP_KEYS], next[AVX_STEP_KEYS]; /* element offsets of a step's tokens */
    const int64_t steps = (len + AVX_STEP_KEYS - 1) / AVX_STEP_KEYS;
    for (int64_t i = 0; i < AVX_STEP_KEYS; i++)
        next[i] = i < len ? (table[i / block_size] * block_size + i % block_size) * token_stride : -1;
    for (int64_t step = 0; step < steps; step++) {
        for (int64_t i = 0; i < AVX_STEP_KEYS; i++) here[i] = next[i];
        for (int64_t i = 0; i < AVX_STEP_KEYS; i++) { /* the next step's tokens, prefetched */
            const int64_t key = (step + 1) * AVX_STEP_KEYS + i;
            next[i] = key < len ? (table[key / block_size] * block_size + key % block_size) * token_stride : -1;
            if (next[i] < 0) continue;
            const char *k = (const char *)(keys + next[i]), *v = (const char *)(values + next[i]);
            for (int64_t line = 0; line < span_bytes; line += 64) {
                _mm_prefetch(k + line, _MM_HINT_T0);
                _mm_prefetch(v + line, _MM_HINT_T0);
            }
        }
        for (int64_t h = 0; h < nh; h++) {
            const uint16_t *key_rows[AVX_STEP_KEYS], *value_rows[AVX_STEP_KEYS];
            for (int64_t i = 0; i < AVX_STEP_KEYS; i++) {
                key_rows[i] = here[i] < 0 ? NULL : keys + here[i] + h * head_dim;
                value_rows[i] = here[i] < 0 ? NULL : values + here[i] + h * head_dim;
            }
            avx_pack_step(key_rows, value_rows, head_dim, kp, vp);
            for (int64_t part = 0; part < per_head; part++)
                avx_rows_step(&states[h * per_head + part], kp, vp, step, scale);
        }
    }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t part = 0; part < per_head; part++)
            avx_rows_finish(&states[h * per_head + part], out + (h * group + part * AVX_ROWS) * head_dim,
                            head_dim);
}

static int has_tiles(int64_t head_dim, int64_t group) {
    return (head_dim == 64 || head_dim == 128) && (group + AVX_ROWS - 1) / AVX_ROWS <= MAX_TASK_STATES;
}

/* Below this many sequences, a task is one KV head (more tasks than threads). */
#define MIN_SEQS_FOR_WHOLE_TASKS 8

static void decode_attention_bf16_tiles(const uint16_t *q, const uint16_t *cache,
                                        const int64_t *block_ids, const int64_t *seq_lens,
                                        int64_t q_stride, int64_t num_seqs,
                                        int64_t blocks_per_seq, int64_t num_blocks,
                                        int64_t block_size, int64_t num_heads,
                                        int64_t num_kv_heads, int64_t head_dim, float scale,
                                        uint16_t *out) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_dim;
    const uint16_t *values = cache + num_blocks * block_size * token_stride;
    int64_t per_task = 1;
    if (num_seqs >= MIN_SEQS_FOR_WHOLE_TASKS) {
        per_task = MAX_TASK_STATES / ((group + AVX_ROWS - 1) / AVX_ROWS);
        if (per_task > num_kv_heads) per_task = num_kv_heads;
    }
    const int64_t tasks_per_seq = (num_kv_heads + per_task - 1) / per_task;
    const int64_t num_tasks = num_seqs * tasks_per_seq;
    _Pragma("omp parallel for schedule(dynamic, 1) if (num_tasks >= 2)")
    for (int64_t task = 0; task < num_tasks; task++) {
        const int64_t b = task / tasks_per_seq, h0 = (task % tasks_per_seq) * per_task;
        const int64_t nh = num_kv_heads - h0 < per_task ? num_kv_heads - h0 : per_task;
        attend_task_bf16(q + b * q_stride + h0 * group * head_dim, cache, values, block_ids + b * blocks_per_seq,
                         seq_lens[b], block_size, token_stride, group, head_dim, h0, nh, scale,
                         out + b * num_heads * head_dim + h0 * group * head_dim);
    }
}

/* An int8 pool's row (sluice/models/kv_int8.py: head_dim int8 values, then a
 * float32 scale per KV_GROUP channels) as bfloat16: bf16(float(q) * scale),
 * rounded to nearest even as torch rounds (denormals kept), so a step packs
 * the very words the bf16 kernels read from kv_int8.readable_pool's copy of
 * the row. One 16-lane vector is one group. */
#define KV_GROUP 16
static inline int64_t int8_row_bytes(int64_t head_dim) { return head_dim + head_dim / KV_GROUP * 4; }

static void dequantize_row(const int8_t *row, int64_t head_dim, uint16_t *dst) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    for (int64_t d = 0; d < head_dim; d += KV_GROUP) {
        float scale;
        memcpy(&scale, row + head_dim + d / KV_GROUP * 4, sizeof scale);
        const __m128i q = _mm_loadu_si128((const __m128i *)(row + d));
        const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(scale));
        __m512i u = _mm512_castps_si512(x);
        u = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        _mm256_storeu_si256((__m256i *)(dst + d), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
}

/* attend_task_bf16 over an int8 pool, one KV head h0 (rows of
 * int8_row_bytes(head_dim)): each step's 32 key and value rows are dequantized, then packed and
 * stepped as the bf16 kernel does. */
static void attend_task_int8kv(const uint16_t *q, const int8_t *keys, const int8_t *values,
                               const int64_t *table, int64_t len, int64_t block_size,
                               int64_t token_stride, int64_t group, int64_t head_dim,
                               float scale, uint16_t *out) {
    const int64_t per_head = (group + AVX_ROWS - 1) / AVX_ROWS;
    struct avx_rows states[MAX_TASK_STATES];
    for (int64_t part = 0; part < per_head; part++) {
        const int64_t first = part * AVX_ROWS;
        const int64_t rows = group - first < AVX_ROWS ? group - first : AVX_ROWS;
        avx_rows_start(&states[part], rows, head_dim, q + first * head_dim, head_dim, len - 1, 0);
    }
    uint32_t kp[AVX_STEP_KEYS * AVX_MAX_DIM / 2] __attribute__((aligned(64)));
    uint32_t vp[AVX_STEP_KEYS * AVX_MAX_DIM / 2] __attribute__((aligned(64)));
    uint16_t kd[AVX_STEP_KEYS][AVX_MAX_DIM], vd[AVX_STEP_KEYS][AVX_MAX_DIM];
    const int64_t steps = (len + AVX_STEP_KEYS - 1) / AVX_STEP_KEYS;
    for (int64_t step = 0; step < steps; step++) {
        const uint16_t *key_rows[AVX_STEP_KEYS], *value_rows[AVX_STEP_KEYS];
        for (int64_t i = 0; i < AVX_STEP_KEYS; i++) {
            const int64_t key = step * AVX_STEP_KEYS + i;
            key_rows[i] = value_rows[i] = NULL;
            if (key >= len) continue;
            const int64_t at = (table[key / block_size] * block_size + key % block_size) * token_stride;
            dequantize_row(keys + at, head_dim, kd[i]);
            dequantize_row(values + at, head_dim, vd[i]);
            key_rows[i] = kd[i];
            value_rows[i] = vd[i];
        }
        avx_pack_step(key_rows, value_rows, head_dim, kp, vp);
        for (int64_t part = 0; part < per_head; part++)
            avx_rows_step(&states[part], kp, vp, step, scale);
    }
    for (int64_t part = 0; part < per_head; part++)
        avx_rows_finish(&states[part], out + part * AVX_ROWS * head_dim, head_dim);
}
#define HAS_BF16_TILES 1
#else
#define HAS_BF16_TILES 0
#endif

#define DEFINE_DECODE_ATTENTION(NAME, ATTEND, TILED, T)                                                \
    int NAME(const T *q, const T *cache, const int64_t *block_ids, const int64_t *seq_lens,     \
             int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq, int64_t num_blocks,    \
             int64_t block_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,     \
             float scale, T *out) {                                                             \
        if (head_dim > MAX_HEAD_DIM || num_kv_heads <= 0 || num_heads % num_kv_heads ||         \
            num_heads / num_kv_heads > MAX_GROUP)                                               \
            return -1;                                                                          \
        if (check_tables(block_ids, seq_lens, num_seqs, blocks_per_seq, num_blocks, block_size)) \
            return -1;                                                                          \
        if (TILED(q, cache, block_ids, seq_lens, q_stride, num_seqs, blocks_per_seq, num_blocks, \
                  block_size, num_heads, num_kv_heads, head_dim, scale, out))                   \
            return 0;                                                                           \
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

/* The tiled path where it applies (1: done), else 0 and the pairs below. */
static int tiled_bf16(const uint16_t *q, const uint16_t *cache, const int64_t *block_ids,
                      const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                      int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                      int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                      uint16_t *out) {
#if HAS_BF16_TILES
    if (has_tiles(head_dim, num_heads / num_kv_heads)) {
        decode_attention_bf16_tiles(q, cache, block_ids, seq_lens, q_stride, num_seqs,
                                    blocks_per_seq, num_blocks, block_size, num_heads,
                                    num_kv_heads, head_dim, scale, out);
        return 1;
    }
#endif
    (void)q, (void)cache, (void)block_ids, (void)seq_lens, (void)q_stride, (void)num_seqs;
    (void)blocks_per_seq, (void)num_blocks, (void)block_size, (void)num_heads;
    (void)num_kv_heads, (void)head_dim, (void)scale, (void)out;
    return 0;
}

static int tiled_f32(const float *q, const float *cache, const int64_t *block_ids,
                     const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                     int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                     int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                     float *out) {
    (void)q, (void)cache, (void)block_ids, (void)seq_lens, (void)q_stride, (void)num_seqs;
    (void)blocks_per_seq, (void)num_blocks, (void)block_size, (void)num_heads;
    (void)num_kv_heads, (void)head_dim, (void)scale, (void)out;
    return 0;
}

DEFINE_DECODE_ATTENTION(decode_attention_bf16, attend_one_bf16, tiled_bf16, uint16_t)
DEFINE_DECODE_ATTENTION(decode_attention_f32, attend_one_f32, tiled_f32, float)

/* Decode attention over an int8 pool (models/kv_int8.py): cache is
 * [2, num_blocks, block_size, num_kv_heads, int8_row_bytes(head_dim)] int8. Only where the
 * bf16 kernel takes its fixed key blocks (AVX512-BF16, heads of 64 or 128):
 * there a row gets the bits the bf16 kernel gives it over the dequantized
 * pool. Returns 1 (nothing written) elsewhere: the caller dequantizes. */
int decode_attention_int8kv_bf16(const uint16_t *q, const int8_t *cache,
                                 const int64_t *block_ids, const int64_t *seq_lens,
                                 int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq,
                                 int64_t num_blocks, int64_t block_size, int64_t num_heads,
                                 int64_t num_kv_heads, int64_t head_dim, float scale,
                                 uint16_t *out) {
    if (num_kv_heads <= 0 || num_heads % num_kv_heads) return -1;
    if (check_tables(block_ids, seq_lens, num_seqs, blocks_per_seq, num_blocks, block_size))
        return -1;
#if HAS_BF16_TILES
    const int64_t group = num_heads / num_kv_heads;
    if (!has_tiles(head_dim, group)) return 1;
    const int64_t row_bytes = int8_row_bytes(head_dim);
    const int64_t token_stride = num_kv_heads * row_bytes;
    const int8_t *values = cache + num_blocks * block_size * token_stride;
    const int64_t num_tasks = num_seqs * num_kv_heads;
    _Pragma("omp parallel for schedule(dynamic, 1) if (num_tasks >= 2)")
    for (int64_t task = 0; task < num_tasks; task++) {
        const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
        attend_task_int8kv(q + b * q_stride + h * group * head_dim, cache + h * row_bytes,
                           values + h * row_bytes, block_ids + b * blocks_per_seq,
                           seq_lens[b], block_size, token_stride, group, head_dim, scale,
                           out + (b * num_heads + h * group) * head_dim);
    }
    return 0;
#else
    (void)q, (void)cache, (void)q_stride, (void)num_heads, (void)head_dim, (void)scale, (void)out;
    return 1;
#endif
}
