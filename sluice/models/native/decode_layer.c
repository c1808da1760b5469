/* A whole Llama decoder layer for a step whose tokens all run as decode rows
 * (a decode step, a speculative step's verified tokens), in one call: the
 * same kernels, in the same order, with the same roundings as the layer's
 * Python path (llama.py), so the same bits; what goes is the Python between
 * them (about 11 calls per layer, 330 per step, 20-25% of a one-stream
 * decode step on the embedded model).
 *
 *   x = rms_norm(hidden; attention_norm)         rms_norm.c
 *   qkv = x W_qkv (int8 activations)             int8_gemm.c, or qblock_gemm.c for
 *                                                a GGUF's blocks (each matrix its own)
 *   q, k = rope(qkv); k, v into the cache        rope_kv.c
 *   a = decode attention of q over the cache     paged_decode_attention.c, or
 *                                                decode_attention_amx.c (decode_amx)
 *   hidden += a W_o                              (bfloat16 add: torch's rounding)
 *   x = rms_norm(hidden; mlp_norm)
 *   hidden += silu_mul(x W_gate_up) W_down       rows.c, int8_gemm.c
 *
 * `hidden` [rows, hidden_size] bfloat16, contiguous, is updated in place.
 * Returns 0; -1 when a kernel refused (a slot or block id out of range, no
 * memory): hidden may then be half updated, and the caller raises. */
#include <stdint.h>
#include <stdlib.h>

#include "sluice_abi.h" /* Int8Matrix, DecoderLayer and the other files' kernels */
#include "bf16.h"

/* out = x W^T: the W8A8 kernel, or the GGUF-block parts, each into its
 * column slice (QBlockLinear.forward's one call). */
static int matmul(const LayerMatrix *matrix, const uint16_t *x, int64_t rows,
                  int64_t amx_min_rows, uint16_t *out) {
    const Int8Matrix *m = &matrix->int8;
    if (matrix->num_parts == 0)
        return int8_linear_bf16(x, rows, m->in_features, m->in_features, m->inv_smooth,
                                m->packed, m->compensation, m->col_scales, m->bias,
                                m->out_features, out, (int)m->pairs, amx_min_rows);
    int64_t width = 0;
    for (int64_t i = 0; i < matrix->num_parts; i++) width += matrix->parts[i].out_features;
    if (width != m->out_features) return -1;
    /* All parts in one call: the rows quantized once for q/k/v (gate/up). */
    return qblock_linear(x, 1, rows, m->in_features, matrix->parts, matrix->num_parts, out, 1,
                         m->out_features);
}

/* hidden += y, each sum rounded once to bfloat16 (torch's bfloat16 add_). */
static void add_into(uint16_t *hidden, const uint16_t *y, int64_t count) {
    for (int64_t i = 0; i < count; i++) bf16_store(hidden + i, bf16_load(hidden + i) + bf16_load(y + i));
}

int decoder_layer_rows_bf16(const DecoderLayer *layer, uint16_t *hidden, int64_t rows,
                            const float *cos, const float *sin, uint16_t *cache,
                            int64_t num_blocks, int64_t block_size, const int64_t *slot_mapping,
                            const int64_t *block_ids, int64_t blocks_per_seq,
                            const int64_t *seq_lens, const int64_t *amx_min_rows) {
    const int64_t hidden_size = layer->hidden_size, head_dim = layer->head_dim;
    const int64_t q_width = layer->num_heads * head_dim;
    const int64_t qkv_width = layer->qkv.int8.out_features;
    /* One scratch allocation: x, qkv, q, k, attention out, y, gate_up, act. */
    const int64_t gate_up_width = layer->gate_up.int8.out_features;
    const int64_t widest = qkv_width > gate_up_width ? qkv_width : gate_up_width;
    const int64_t sizes[] = {hidden_size, widest, q_width, layer->num_kv_heads * head_dim,
                             q_width, hidden_size, layer->intermediate_size};
    int64_t total = 0;
    for (int i = 0; i < 7; i++) total += rows * sizes[i];
    uint16_t *scratch = malloc(sizeof(uint16_t) * (size_t)total);
    if (scratch == NULL) return -1;
    uint16_t *x = scratch, *wide = x + rows * sizes[0], *q = wide + rows * sizes[1];
    uint16_t *k = q + rows * sizes[2], *attn = k + rows * sizes[3], *y = attn + rows * sizes[4];
    uint16_t *act = y + rows * sizes[5];
    int status = -1;
    /* Attention. */
    rms_norm_bf16(hidden, layer->attention_norm, rows, hidden_size, hidden_size, layer->eps, x);
    if (matmul(&layer->qkv, x, rows, amx_min_rows[0], wide)) goto done;
    if (rope_write_kv_bf16(wide, rows, qkv_width, layer->num_heads, layer->num_kv_heads,
                           head_dim, cos, sin, cache, num_blocks * block_size, slot_mapping, q,
                           k))
        goto done;
    if ((layer->decode_amx ? decode_attention_amx_bf16 : decode_attention_bf16)(
            q, cache, block_ids, seq_lens, q_width, rows, blocks_per_seq, num_blocks, block_size,
            layer->num_heads, layer->num_kv_heads, head_dim, layer->scale, attn))
        goto done;
    if (matmul(&layer->o, attn, rows, amx_min_rows[1], y)) goto done;
    add_into(hidden, y, rows * hidden_size);
    /* MLP. */
    rms_norm_bf16(hidden, layer->mlp_norm, rows, hidden_size, hidden_size, layer->eps, x);
    if (matmul(&layer->gate_up, x, rows, amx_min_rows[2], wide)) goto done;
    silu_mul_bf16(wide, rows, layer->intermediate_size, gate_up_width, act);
    if (matmul(&layer->down, act, rows, amx_min_rows[3], y)) goto done;
    add_into(hidden, y, rows * hidden_size);
    status = 0;
done:
    free(scratch);
    return status;
}
