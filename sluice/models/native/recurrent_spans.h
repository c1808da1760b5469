/* Where the recurrent kernels (gated_delta.c, mamba_scan.c) read and write
 * their per-sequence states: spans [num_seqs, 3] (first token, number of
 * tokens, the cache row the state starts from, -1: zeros) and saves
 * [num_saves, 3] sorted by sequence then m ((sequence, m, target): the state
 * after m tokens goes to cache row target, or kept row -1 - target). A row's
 * state is `state_numel` floats from cache + row * cache_stride. The rows
 * are checked once per call; each (sequence, head) task then copies its
 * head's slice [offset, offset + n) of the rows it names. */
#ifndef SLUICE_RECURRENT_SPANS_H
#define SLUICE_RECURRENT_SPANS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const int64_t *spans;
    int64_t num_seqs;
    const int64_t *saves;
    int64_t num_saves;
    float *cache;
    int64_t cache_rows, cache_stride;
    float *kept;
    int64_t kept_rows, kept_stride;
    int64_t state_numel;
} RecurrentRows;

/* Each sequence's first save (an array of num_seqs + 1 to free), or NULL
 * where a row, a span or the saves' order is out of range. */
static inline int64_t *recurrent_rows_check(const RecurrentRows *r) {
    if (r->num_seqs < 0 || r->num_saves < 0) return NULL;
    if (r->cache_stride < r->state_numel || (r->kept_rows > 0 && r->kept_stride < r->state_numel))
        return NULL;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(r->num_seqs + 1));
    if (first == NULL) return NULL;
    int64_t save = 0, ok = 1;
    for (int64_t seq = 0; ok && seq < r->num_seqs; seq++) {
        const int64_t *span = r->spans + 3 * seq;
        ok = span[0] >= 0 && span[1] >= 0 && span[2] >= -1 && span[2] < r->cache_rows;
        first[seq] = save;
        for (int64_t last_m = 0; ok && save < r->num_saves && r->saves[3 * save] == seq; save++) {
            const int64_t m = r->saves[3 * save + 1], target = r->saves[3 * save + 2];
            ok = m >= last_m && m <= span[1] && target < r->cache_rows && -1 - target < r->kept_rows;
            last_m = m;
        }
    }
    if (!ok || save != r->num_saves) {
        free(first);
        return NULL;
    }
    first[r->num_seqs] = save;
    return first;
}

static inline float *recurrent_row(const RecurrentRows *r, int64_t target) {
    return target >= 0 ? r->cache + target * r->cache_stride
                       : r->kept + (-1 - target) * r->kept_stride;
}

/* s [n] <- the sequence's start state's slice at offset (zeros for row -1). */
static inline void recurrent_load(const RecurrentRows *r, int64_t seq, int64_t offset, int64_t n,
                                  float *s) {
    const int64_t source = r->spans[3 * seq + 2];
    if (source < 0)
        memset(s, 0, sizeof(float) * (size_t)n);
    else
        memcpy(s, r->cache + source * r->cache_stride + offset, sizeof(float) * (size_t)n);
}

/* Whether the sequence can run in its start row: it starts from a cache row
 * (a decode step's slot) that only its final state is saved to. Then the
 * state is not copied in and out: that row is the running state. */
static inline int recurrent_in_place(const RecurrentRows *r, int64_t seq, int64_t first) {
    const int64_t *span = r->spans + 3 * seq;
    int found = 0;
    if (span[2] < 0) return 0;
    for (int64_t i = first; i < r->num_saves && r->saves[3 * i] == seq; i++) {
        if (r->saves[3 * i + 2] != span[2]) continue;
        if (r->saves[3 * i + 1] != span[1]) return 0;
        found = 1;
    }
    return found;
}

/* Copy s [n] to every target the saves name for the state after m tokens,
 * from save `next` on (but to s itself); the next save not yet reached. */
static inline int64_t recurrent_save(const RecurrentRows *r, int64_t seq, int64_t m, int64_t next,
                                     int64_t offset, int64_t n, const float *s) {
    for (; next < r->num_saves && r->saves[3 * next] == seq && r->saves[3 * next + 1] == m;
         next++) {
        float *target = recurrent_row(r, r->saves[3 * next + 2]) + offset;
        if (target != s) memcpy(target, s, sizeof(float) * (size_t)n);
    }
    return next;
}

/* One token of a kernel's recurrence on one head's state s (in place), with
 * scratch of the size the kernel asked recurrent_walk for. */
typedef void (*RecurrentStep)(const void *kernel, int64_t token, int64_t head, float *s,
                              float *scratch);

/* The span walker both kernels share: every (sequence, head) task, OpenMP
 * over them, runs `step` on the head's slice [h * head_numel, +head_numel)
 * of its sequence's state token by token, the state loaded from the span's
 * start row (or run in that row: recurrent_in_place) and saved after each m
 * the saves name. 0, or -1 where the rows are out of range or memory ran out. */
static inline int recurrent_walk(const RecurrentRows *r, int64_t num_heads, int64_t head_numel,
                                 int64_t scratch_numel, RecurrentStep step, const void *kernel) {
    int64_t *first_save = recurrent_rows_check(r);
    if (first_save == NULL) return -1;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int64_t task = 0; task < r->num_seqs * num_heads; task++) {
        const int64_t seq = task / num_heads, h = task % num_heads;
        const int64_t *span = r->spans + 3 * seq;
        int64_t next = first_save[seq];
        const int in_place = recurrent_in_place(r, seq, next);
        const int64_t numel = (in_place ? 0 : head_numel) + scratch_numel;
        float *buffer = malloc(sizeof(float) * (size_t)numel);
        if (buffer == NULL) {
            failed = 1;
            continue;
        }
        float *s = in_place ? r->cache + span[2] * r->cache_stride + h * head_numel : buffer;
        float *scratch = in_place ? buffer : buffer + head_numel;
        if (!in_place) recurrent_load(r, seq, h * head_numel, head_numel, s);
        for (int64_t m = 0;; m++) {
            next = recurrent_save(r, seq, m, next, h * head_numel, head_numel, s);
            if (m == span[1]) break;
            step(kernel, span[0] + m, h, s, scratch);
        }
        free(buffer);
    }
    free(first_save);
    return failed ? -1 : 0;
}

/* sum of x[i] * y[i] in a fixed order: 16 lane partials (i mod 16), then halving. */
static inline float fixed_sum_of_products(const float *x, const float *y, int64_t n) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + x[i + l] * y[i + l];
    for (int l = 0; i + l < n; l++) lanes[l] = lanes[l] + x[i + l] * y[i + l];
    for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] = lanes[l] + lanes[l + width];
    return lanes[0];
}

#endif
