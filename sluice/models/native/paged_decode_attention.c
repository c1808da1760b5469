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
/* The bfloat16 path on CPUs with AVX512-BF16, for head_dim a multiple of 32:
 * keys in tiles of 16, an online softmax (a running maximum and sum per
 * query head, flash-decoding's rescaling), so each K and V row is read once
 * for the G query heads and no score buffer is needed.
 *   - scores: vdpbf16ps multiplies the bfloat16 query and key pairs exactly
 *     into float32 sums, 16 lanes per key; `sum16` then turns 16 keys' lane
 *     vectors into one vector of their 16 sums (a transpose-and-add tree, 45
 *     shuffles and adds against 16 separate horizontal sums);
 *   - softmax: `exp16`, the vector form of vector_exp.h's polynomial;
 *   - the weighted sum of V in float32, the tile's value rows converted once.
 * Against the scalar-sum kernel below, the embedded model's shapes (9 query
 * and 3 KV heads of 64), 64 sequences of 100 tokens, bf16: 268-328 us per
 * layer instead of 550-732 with the cache in L3; 660-730 instead of 950-1280
 * with 30 layers' caches read in turn, as in a step. */
#include <immintrin.h>

#define TILE 16
/* The head sizes with a tiled path (others take attend_one_bf16). */
#define MAX_TILE_DIM 128

static inline __m512 sum16(__m512 v[TILE]) {
    __m512 s1[8], s2[4];
    for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                              _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __m512 load_bf16x16(const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Query heads one task keeps state for (a task's KV heads times the group). */
#define MAX_TASK_HEADS 32

/* KV heads [h0, h0 + nh) of one sequence. A task takes every KV head of its
 * sequence when there are enough sequences to go round the threads: then a
 * token's keys (and values) for all its heads are one contiguous read, where
 * one head's rows alone are a third of each stretch of memory (measured: the
 * hardware prefetcher then fetched much that no one read). head_dim is a
 * constant in each caller below, so the loops over it unroll. */
static inline __attribute__((always_inline)) void attend_tiles(
    const uint16_t *q, const uint16_t *keys, const uint16_t *values, const int64_t *table,
    int64_t len, int64_t block_size, int64_t token_stride, int64_t group, const int64_t head_dim,
    int64_t h0, int64_t nh, float scale, uint16_t *out) {
    const int64_t pairs = head_dim / 32, chunks = head_dim / 16, num_q = nh * group;
    __m512 acc[MAX_TASK_HEADS][MAX_TILE_DIM / 16];
    float top[MAX_TASK_HEADS], total[MAX_TASK_HEADS];
    for (int64_t j = 0; j < num_q; j++) {
        top[j] = -INFINITY;
        total[j] = 0.0f;
        for (int64_t c = 0; c < chunks; c++) acc[j][c] = _mm512_setzero_ps();
    }
    const __m512 scales = _mm512_set1_ps(scale);
    const int64_t span_bytes = nh * head_dim * (int64_t)sizeof(uint16_t);
    keys += h0 * head_dim;
    values += h0 * head_dim;
    /* Where each key of the current and the next tile sits (offsets in
     * elements); the next tile is prefetched while this one is computed. */
    int64_t offsets[2][TILE];
    int64_t block = 0, in_block = 0;
    for (int64_t t = 0; t < 2; t++)
        for (int64_t i = 0; i < TILE && t * TILE + i < len; i++) {
            offsets[t][i] = (table[block] * block_size + in_block) * token_stride;
            if (++in_block == block_size) in_block = 0, block++;
        }
    for (int64_t start = 0, cur = 0; start < len; start += TILE, cur ^= 1) {
        const int64_t n = len - start < TILE ? len - start : TILE;
        int64_t here[TILE];
        for (int64_t i = 0; i < n; i++) here[i] = offsets[cur][i];
        /* The tile after the next one: its offsets replace this tile's. */
        const int64_t ahead = start + 2 * TILE;
        for (int64_t i = 0; i < TILE && ahead + i < len; i++) {
            offsets[cur][i] = (table[block] * block_size + in_block) * token_stride;
            if (++in_block == block_size) in_block = 0, block++;
        }
        const int64_t next_n = len - start - TILE < TILE ? len - start - TILE : TILE;
        for (int64_t i = 0; i < next_n; i++) {
            const char *k = (const char *)(keys + offsets[cur ^ 1][i]);
            const char *v = (const char *)(values + offsets[cur ^ 1][i]);
            for (int64_t line = 0; line < span_bytes; line += 64) {
                _mm_prefetch(k + line, _MM_HINT_T0);
                _mm_prefetch(v + line, _MM_HINT_T0);
            }
        }
        const __mmask16 valid = (__mmask16)((1u << n) - 1);
        /* 1. Every query head's 16 scores (independent across heads). */
        float weights[MAX_TASK_HEADS][TILE], rescale[MAX_TASK_HEADS];
        for (int64_t j = 0; j < num_q; j++) {
            const uint16_t *qj = q + j * head_dim;
            const int64_t kv_offset = (j / group) * head_dim;
            __m512 part[TILE];
            for (int64_t i = 0; i < TILE; i++) {
                __m512 dot = _mm512_setzero_ps();
                if (i < n) {
                    const uint16_t *krow = keys + here[i] + kv_offset;
                    for (int64_t c = 0; c < pairs; c++)
                        dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(qj + 32 * c),
                                               (__m512bh)_mm512_loadu_si512(krow + 32 * c));
                }
                part[i] = dot;
            }
            _mm512_storeu_ps(weights[j], _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid,
                                                             _mm512_mul_ps(sum16(part), scales)));
        }
        /* 2. The online softmax's update, head by head. */
        for (int64_t j = 0; j < num_q; j++) {
            const __m512 s = _mm512_loadu_ps(weights[j]);
            const float new_top = fmaxf(top[j], _mm512_reduce_max_ps(s));
            rescale[j] = top[j] == -INFINITY ? 0.0f : expf(top[j] - new_top);
            const __m512 w = exp16(_mm512_sub_ps(s, _mm512_set1_ps(new_top)));
            total[j] = total[j] * rescale[j] + _mm512_reduce_add_ps(w);
            top[j] = new_top;
            _mm512_storeu_ps(weights[j], w);
        }
        /* 3. The weighted values: each value row converted once per KV head,
         * two partial sums per output chunk (halves the FMA chains). */
        for (int64_t h = 0; h < nh; h++) {
            __m512 vf[TILE][MAX_TILE_DIM / 16];
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < chunks; c++)
                    vf[i][c] = load_bf16x16(values + here[i] + h * head_dim + 16 * c);
            for (int64_t i = n; i < TILE; i++)
                for (int64_t c = 0; c < chunks; c++) vf[i][c] = _mm512_setzero_ps();
            for (int64_t g = 0; g < group; g++) {
                const int64_t j = h * group + g;
                __m512 even[MAX_TILE_DIM / 16], odd[MAX_TILE_DIM / 16];
                for (int64_t c = 0; c < chunks; c++) {
                    even[c] = _mm512_mul_ps(acc[j][c], _mm512_set1_ps(rescale[j]));
                    odd[c] = _mm512_setzero_ps();
                }
                for (int64_t i = 0; i < n; i += 2) {
                    const __m512 w0 = _mm512_set1_ps(weights[j][i]);
                    const __m512 w1 = _mm512_set1_ps(weights[j][i + 1]);  /* 0 past n */
                    for (int64_t c = 0; c < chunks; c++) {
                        even[c] = _mm512_fmadd_ps(w0, vf[i][c], even[c]);
                        odd[c] = _mm512_fmadd_ps(w1, vf[i + 1][c], odd[c]);
                    }
                }
                for (int64_t c = 0; c < chunks; c++) acc[j][c] = _mm512_add_ps(even[c], odd[c]);
            }
        }
    }
    for (int64_t j = 0; j < num_q; j++) {
        const float inv = 1.0f / total[j];
        float row[MAX_TILE_DIM];
        for (int64_t c = 0; c < chunks; c++)
            _mm512_storeu_ps(row + 16 * c, _mm512_mul_ps(acc[j][c], _mm512_set1_ps(inv)));
        for (int64_t d = 0; d < head_dim; d++) bf16_store(out + j * head_dim + d, row[d]);
    }
}

static void attend_task_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                             const int64_t *table, int64_t len, int64_t block_size,
                             int64_t token_stride, int64_t group, int64_t head_dim, int64_t h0,
                             int64_t nh, float scale, uint16_t *out) {
    if (head_dim == 64)
        attend_tiles(q, keys, values, table, len, block_size, token_stride, group, 64, h0, nh,
                     scale, out);
    else
        attend_tiles(q, keys, values, table, len, block_size, token_stride, group, 128, h0, nh,
                     scale, out);
}

static int has_tiles(int64_t head_dim, int64_t group) {
    return (head_dim == 64 || head_dim == 128) && group <= MAX_TASK_HEADS;
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
        per_task = MAX_TASK_HEADS / group;
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
