/* The routing side of moe_qblock.c and moe_mxfp4.c, an MoE layer's chosen
 * experts in one call: the (token, rank) assignments grouped by expert
 * (stably, as torch's argsort), each token's rows copied to its assignments'
 * places, and the weighted sum in rank order (float32 multiplies and adds,
 * each rounded alone: a token's result depends only on its own routing).
 * Static: compiled into each file that includes it, under the pragmas
 * below (no-fast-math, fp-contract=off: a fused multiply-add would round
 * the sum differently from the per-expert path's), which hold for the rest of
 * that file too. */
#ifndef MOE_ROWS_H
#define MOE_ROWS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

/* The chosen experts: slot s is expert[s], its grouped rows start[s]..start[s + 1]. */
typedef struct {
    int64_t count;
    int64_t *expert; /* [count] */
    int64_t *start;  /* [count + 1] */
} chosen;

/* Assignment a's place among the rows grouped by expert (pos), and the
 * chosen experts; -1 for an id outside [0, num_experts) or no memory. */
static inline int group_by_expert(const int64_t *ids, int64_t assignments, int64_t num_experts,
                                  int64_t *pos, chosen *c) {
    int64_t *next = calloc((size_t)num_experts + 1, sizeof(int64_t));
    c->expert = malloc(sizeof(int64_t) * (size_t)(assignments + 1));
    c->start = malloc(sizeof(int64_t) * (size_t)(assignments + 2));
    if (next == NULL || c->expert == NULL || c->start == NULL) {
        free(next);
        return -1;
    }
    for (int64_t a = 0; a < assignments; a++) {
        if (ids[a] < 0 || ids[a] >= num_experts) {
            free(next);
            return -1;
        }
        next[ids[a] + 1]++;
    }
    c->count = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        if (next[e + 1] > 0) {
            c->expert[c->count] = e;
            c->start[c->count++] = next[e];
        }
        next[e + 1] += next[e];
    }
    c->start[c->count] = assignments;
    for (int64_t a = 0; a < assignments; a++) pos[a] = next[ids[a]]++;
    free(next);
    return 0;
}

/* out[t] = sum over ranks, in order, of weights[t, r] * the expert rows at pos[t, r] (float32). */
static inline void weighted_sum(const void *rows, int bf16, const int64_t *pos, const float *weights,
                         int64_t tokens, int64_t top_k, int64_t hidden, float *out) {
#pragma omp parallel for schedule(static) if (tokens >= 4)
    for (int64_t t = 0; t < tokens; t++) {
        float *o = out + t * hidden;
        for (int64_t r = 0; r < top_k; r++) {
            const int64_t at = pos[t * top_k + r] * hidden;
            const float w = weights[t * top_k + r];
            for (int64_t i = 0; i < hidden; i++) {
                const float v = (bf16 ? bf16_load((const uint16_t *)rows + at + i)
                                      : f32_load((const float *)rows + at + i)) * w;
                o[i] = r == 0 ? v : o[i] + v;
            }
        }
    }
}

/* rows[pos[a]] = x[a / top_k] for every assignment a (rows of `hidden`
 * elements of `element` bytes). */
static inline void gather_rows(const void *x, int64_t element, int64_t hidden, const int64_t *pos,
                        int64_t assignments, int64_t top_k, char *rows) {
    for (int64_t a = 0; a < assignments; a++)
        memcpy(rows + pos[a] * hidden * element, (const char *)x + a / top_k * hidden * element,
               (size_t)(hidden * element));
}

#endif
