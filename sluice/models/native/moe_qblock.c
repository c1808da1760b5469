/* A mixture-of-experts layer's routed experts in one call, their weights
 * kept in GGUF blocks (qblock_gemm.c's packed layout; models/moe_blocks.py):
 *
 *     out[t] = sum over ranks r, in order, of w[t, r] * E_{id[t, r]}(x[t])
 *     E(x) = down(silu(gate x) * up x)
 *
 * the values moe_blocks.py's one-call-per-projection path gives, bit for
 * bit: the (token, rank) assignments are grouped by expert (stably, as
 * torch's argsort), each chosen expert's gate/up and down run over its rows
 * with qblock_gemm.c's kernels (a row's bits never depend on the rows beside
 * it), silu_mul (rows.c) rounds between them in the model dtype, and the
 * weighted sum is float32 multiplies and adds, each rounded alone, in rank
 * order. So a token's result depends only on its own routing.
 *
 * Work: all chosen experts' (row chunk, tile group) items of a projection
 * share one OpenMP loop, so a decode step with one row per expert keeps
 * every thread busy; only the chosen experts' blocks are read. */
#include <stdlib.h>
#include <string.h>

#include "sluice_abi.h"
#include "bf16.h"
#include "moe_rows.h"
#include "qblock_kernel.h"

#pragma GCC optimize("no-fast-math")
#pragma GCC optimize("fp-contract=off")

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

static const QBlockPart *part_of(const QBlockExpert *e, int is_down, int64_t p) {
    return is_down ? &e->down[p] : &e->gate_up[p];
}

static int64_t num_parts(const QBlockExpert *e, int is_down) {
    return is_down ? e->num_down : e->num_gate_up;
}

/* Part p of every chosen expert: one kernel, one format and width (a GGUF
 * stacks a layer's experts in one tensor), or NULL. */
static block_fn common_kernel(const QBlockExpert *experts, const chosen *c, int is_down,
                              int64_t p, int64_t k) {
    const QBlockPart *first = part_of(&experts[c->expert[0]], is_down, p);
    const block_fn kernel = qblock_kernel_for(first);
    if (kernel == NULL || k % first->super_block != 0) return NULL;
    for (int64_t s = 1; s < c->count; s++) {
        const QBlockExpert *e = &experts[c->expert[s]];
        const QBlockPart *part = part_of(e, is_down, p);
        if (num_parts(e, is_down) <= p || qblock_kernel_for(part) != kernel ||
            part->out_features != first->out_features)
            return NULL;
    }
    return kernel;
}

/* in [A, k] (grouped rows) times each chosen expert's gate/up or down parts
 * -> out [A, width], in's dtype: qblock_linear's steps, every expert at once
 * (one span a chosen expert, its rows, in one loop a part). */
static int grouped_projection(const void *in, int bf16, int64_t k, const QBlockExpert *experts,
                              const chosen *c, int is_down, void *out, int64_t width) {
    activations act;
    span *spans = malloc(sizeof(span) * (size_t)c->count);
    int status = spans != NULL ? qblock_activations_alloc(&act, c->start[c->count], k) : -1;
    if (status != 0) {
        free(spans);
        return -1;
    }
    const int64_t element = bf16 ? 2 : 4;
    int64_t column = 0;
    for (int64_t p = 0; status == 0 && p < num_parts(&experts[c->expert[0]], is_down); p++) {
        const QBlockPart *model = part_of(&experts[c->expert[0]], is_down, p);
        const block_fn kernel = common_kernel(experts, c, is_down, p, k);
        if (kernel == NULL || column + model->out_features > width) {
            status = -1;
            break;
        }
        for (int64_t s = 0; s < c->count; s++) {
            spans[s].start = c->start[s], spans[s].end = c->start[s + 1];
            qblock_prepare(in, bf16, &act, part_of(&experts[c->expert[s]], is_down, p),
                           (char *)out + column * element, bf16, width, &spans[s].jb);
        }
        qblock_run_spans(kernel, spans, c->count, model->out_features);
        column += model->out_features;
    }
    if (status == 0 && column != width) status = -1;
    qblock_activations_free(&act);
    free(spans);
    return status;
}

int qblock_moe(const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter,
               const QBlockExpert *experts, int64_t num_experts, const int64_t *expert_ids,
               const float *weights, int64_t top_k, float *out) {
    const int64_t assignments = tokens * top_k, element = x_bf16 ? 2 : 4;
    if (assignments == 0) return 0;
    chosen c = {0, NULL, NULL};
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)assignments);
    char *rows = malloc((size_t)(assignments * hidden * element));
    char *gate_up = malloc((size_t)(assignments * 2 * inter * element));
    char *act = malloc((size_t)(assignments * inter * element));
    char *down = malloc((size_t)(assignments * hidden * element));
    int status = pos && rows && gate_up && act && down ? 0 : -1;
    if (status == 0) status = group_by_expert(expert_ids, assignments, num_experts, pos, &c);
    if (status == 0) {
        gather_rows(x, element, hidden, pos, assignments, top_k, rows);
        status = grouped_projection(rows, x_bf16, hidden, experts, &c, 0, gate_up, 2 * inter);
    }
    if (status == 0) {
        if (x_bf16) silu_mul_bf16((const uint16_t *)gate_up, assignments, inter, 2 * inter, (uint16_t *)act);
        else silu_mul_f32((const float *)gate_up, assignments, inter, 2 * inter, (float *)act);
        status = grouped_projection(act, x_bf16, inter, experts, &c, 1, down, hidden);
    }
    if (status == 0) weighted_sum(down, x_bf16, pos, weights, tokens, top_k, hidden, out);
    free(c.start);
    free(c.expert);
    free(down);
    free(act);
    free(gate_up);
    free(rows);
    free(pos);
    return status;
}

#else

int qblock_moe(const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter,
               const QBlockExpert *experts, int64_t num_experts, const int64_t *expert_ids,
               const float *weights, int64_t top_k, float *out) {
    (void)x; (void)x_bf16; (void)tokens; (void)hidden; (void)inter; (void)experts;
    (void)num_experts; (void)expert_ids; (void)weights; (void)top_k; (void)out;
    return -1;
}

#endif
