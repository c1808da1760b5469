/* gpt-oss's MoE layer's routed experts in one call, their weights kept in
 * MXFP4 (mxfp4_gemm.c's groups; models/mxfp4_experts.py):
 *
 *     out[t] = sum over ranks r, in order, of w[t, r] * E_{id[t, r]}(x[t])
 *     E(x) = down(swiglu(gate_up x + b_gate_up)) + b_down
 *     swiglu = rows.c's clamped_swiglu (alpha, limit)
 *
 * the values Mxfp4Experts.forward's one-call-per-projection path gives, bit
 * for bit: the (token, rank) assignments are grouped by expert (moe_rows.h),
 * each chosen expert's gate/up and down run over its rows with
 * mxfp4_gemm.c's work items (a row's bits never depend on the rows beside
 * it), each product is rounded to the model dtype and its bias added as
 * torch's `add_` does, the activation rounds between them, and the weighted
 * sum is float32 multiplies and adds in rank order. So a token's result
 * depends only on its own routing.
 *
 * Work: all chosen experts' (row chunk, column) items of a projection share
 * one OpenMP loop, so a decode step with one row per expert keeps every
 * thread busy; only the chosen experts' groups are read. */
#include <stdint.h>
#include <stdlib.h>

#include "sluice_abi.h"
#include "bf16.h"
#include "moe_rows.h"
#include "mxfp4_kernel.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

/* in [A, k] (grouped rows) times each chosen expert's matrix of `stack`
 * ([E, n, k / 32, 17]) plus its bias ([E, n], in's dtype) -> out [A, n]. */
static int grouped_projection(const void *in, int bf16, int64_t k, const uint8_t *stack,
                              const void *bias, int64_t n, const chosen *c, void *out) {
    mxfp4_rows a;
    int64_t *first_item = malloc(sizeof(int64_t) * (size_t)(c->count + 1));
    if (first_item == NULL || mxfp4_rows_quantize(&a, in, bf16, c->start[c->count], k) != 0) {
        free(first_item);
        return -1;
    }
    const int64_t matrix_bytes = n * (k / MXFP4_GROUP) * MXFP4_GROUP_BYTES;
    const int64_t bias_bytes = n * (bf16 ? 2 : 4);
    first_item[0] = 0;
    for (int64_t s = 0; s < c->count; s++) {
        const int64_t rows = c->start[s + 1] - c->start[s];
        first_item[s + 1] = first_item[s] + (rows + MXFP4_ROW_CHUNK - 1) / MXFP4_ROW_CHUNK * n;
    }
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < first_item[c->count]; item++) {
        int64_t s = 0;
        while (first_item[s + 1] <= item) s++;
        const int64_t local = item - first_item[s], column = local % n;
        const int64_t r0 = c->start[s] + local / n * MXFP4_ROW_CHUNK;
        const int count = c->start[s + 1] - r0 < MXFP4_ROW_CHUNK ? (int)(c->start[s + 1] - r0)
                                                                 : MXFP4_ROW_CHUNK;
        const int64_t e = c->expert[s];
        mxfp4_item(&a, stack + e * matrix_bytes, r0, count, column,
                   (const char *)bias + e * bias_bytes, out, bf16, n);
    }
    mxfp4_rows_free(&a);
    free(first_item);
    return 0;
}

int mxfp4_moe(const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter,
              const uint8_t *gate_up, const uint8_t *down, const void *gate_up_bias,
              const void *down_bias, int64_t num_experts, const int64_t *expert_ids,
              const float *weights, int64_t top_k, float alpha, float limit, float *out) {
    const int64_t assignments = tokens * top_k, element = x_bf16 ? 2 : 4;
    if (hidden % MXFP4_GROUP != 0 || inter % MXFP4_GROUP != 0) return -1;
    if (assignments == 0) return 0;
    chosen c = {0, NULL, NULL};
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)assignments);
    char *rows = malloc((size_t)(assignments * hidden * element));
    char *projected = malloc((size_t)(assignments * 2 * inter * element));
    char *act = malloc((size_t)(assignments * inter * element));
    char *expert_out = malloc((size_t)(assignments * hidden * element));
    int status = pos && rows && projected && act && expert_out ? 0 : -1;
    if (status == 0) status = group_by_expert(expert_ids, assignments, num_experts, pos, &c);
    if (status == 0) {
        gather_rows(x, element, hidden, pos, assignments, top_k, rows);
        status = grouped_projection(rows, x_bf16, hidden, gate_up, gate_up_bias, 2 * inter, &c,
                                    projected);
    }
    if (status == 0) {
        if (x_bf16)
            clamped_swiglu_bf16((const uint16_t *)projected, assignments, inter, 2 * inter, alpha,
                                limit, (uint16_t *)act);
        else
            clamped_swiglu_f32((const float *)projected, assignments, inter, 2 * inter, alpha,
                               limit, (float *)act);
        status = grouped_projection(act, x_bf16, inter, down, down_bias, hidden, &c, expert_out);
    }
    if (status == 0) weighted_sum(expert_out, x_bf16, pos, weights, tokens, top_k, hidden, out);
    free(c.start);
    free(c.expert);
    free(expert_out);
    free(act);
    free(projected);
    free(rows);
    free(pos);
    return status;
}
