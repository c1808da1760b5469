/* The native library's ABI: every function it exports and every struct
 * passed across the boundary, declared once. Every .c file includes it, so
 * the compiler checks each definition against its declaration here; the
 * Python side's ctypes bindings come from one table (abi.py), which a test
 * checks against this file, prototype by prototype and field by field
 * (tests/test_native_abi.py parses it: one declaration per statement, one
 * field per line, no function pointers).
 *
 * Conventions: tensors are passed as pointers to their first element
 * (bfloat16 as uint16_t bits); sizes and strides as int64_t, in elements;
 * a function that can refuse its input returns int (0, or -1); a function
 * named *_available returns 1 where its kernel runs on this CPU. */
#ifndef SLUICE_ABI_H
#define SLUICE_ABI_H

#include <stdint.h>

/* One W8A8 matrix of a fused decoder layer (fused_decode.py). */
typedef struct {
    const int8_t *packed;         /* pack_int8_weights' layout */
    const int32_t *compensation;  /* [out_features] */
    const float *col_scales;      /* [out_features] */
    const float *inv_smooth;      /* [in_features] */
    const uint16_t *bias;         /* [out_features] bfloat16; NULL: none */
    int64_t out_features;
    int64_t in_features;
    int64_t pairs;                /* 1: A13 codes (two int8 rows per row) */
} Int8Matrix;

/* One part of a projection kept in GGUF blocks (qblock_gemm.c's packed
 * layout): its rows are a column slice of the projection's output. */
typedef struct {
    const uint8_t *packed;
    int64_t out_features;
    int64_t bits;
    int64_t sub;
    int64_t super_block;
    int64_t has_scales;
    int64_t has_min;
    int64_t offset;
} QBlockPart;

/* A projection of a fused decoder layer: W8A8 (`int8`), or, where num_parts
 * > 0, GGUF-block parts side by side (QBlockLinear), without bias. Either
 * way int8.out_features and int8.in_features give its shape. */
typedef struct {
    Int8Matrix int8;
    int64_t num_parts;
    const QBlockPart *parts;  /* [num_parts] */
} LayerMatrix;

/* One expert of an MoE layer kept in GGUF blocks (moe_qblock.c): its gate
 * and up rows as parts side by side, and its down rows. */
typedef struct {
    const QBlockPart *gate_up;  /* [num_gate_up] */
    int64_t num_gate_up;
    const QBlockPart *down;     /* [num_down] */
    int64_t num_down;
} QBlockExpert;

/* One Llama decoder layer's weights and shapes (decode_layer.c). */
typedef struct {
    const uint16_t *attention_norm;  /* [hidden_size] bfloat16 */
    const uint16_t *mlp_norm;        /* [hidden_size] bfloat16 */
    LayerMatrix qkv;
    LayerMatrix o;
    LayerMatrix gate_up;
    LayerMatrix down;
    int64_t hidden_size;
    int64_t num_heads;
    int64_t num_kv_heads;
    int64_t head_dim;
    int64_t intermediate_size;
    float eps;
    float scale;
    int64_t decode_amx;  /* 1: decode attention on AMX tiles (the kernel plan's choice) */
} DecoderLayer;

/* paged_decode_attention.c (native/__init__.py: decode_attention_kernel) */
int decode_attention_bf16(const uint16_t *q, const uint16_t *cache, const int64_t *block_ids,
                          const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                          int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                          int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                          uint16_t *out);
int decode_attention_f32(const float *q, const float *cache, const int64_t *block_ids,
                         const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                         int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                         float *out);

int decode_attention_int8kv_bf16(const uint16_t *q, const int8_t *cache,
                                 const int64_t *block_ids, const int64_t *seq_lens,
                                 int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq,
                                 int64_t num_blocks, int64_t block_size, int64_t num_heads,
                                 int64_t num_kv_heads, int64_t head_dim, float scale,
                                 uint16_t *out);

/* decode_attention_amx.c (native/__init__.py: decode_attention_amx_kernel) */
int decode_attention_amx_available(void);
int decode_attention_amx_bf16(const uint16_t *q, const uint16_t *cache, const int64_t *block_ids,
                              const int64_t *seq_lens, int64_t q_stride, int64_t num_seqs,
                              int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size,
                              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                              float scale, uint16_t *out);

/* prefill_attention.c and prefill_attention_amx.c (prefill.py) */
int prefill_attention_available(void);
int prefill_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                           int64_t k_stride, const uint16_t *v, int64_t v_stride,
                           int64_t num_queries, int64_t num_keys, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_dim, float scale, uint16_t *out);
int prefill_attention_amx_available(void);
int prefill_attention_amx_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                               int64_t k_stride, const uint16_t *v, int64_t v_stride,
                               int64_t num_queries, int64_t num_keys, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, float scale,
                               uint16_t *out);

/* rms_norm.c (native/__init__.py: rms_norm_kernel) */
void rms_norm_bf16(const uint16_t *x, const uint16_t *w, int64_t rows, int64_t hidden,
                   int64_t row_stride, float eps, uint16_t *out);
void rms_norm_f32(const float *x, const float *w, int64_t rows, int64_t hidden,
                  int64_t row_stride, float eps, float *out);

/* rows.c (native/__init__.py: silu_mul_kernel, argmax_kernel, merge_attention_kernel) */
void silu_mul_bf16(const uint16_t *x, int64_t rows, int64_t inter, int64_t row_stride,
                   uint16_t *out);
void silu_mul_f32(const float *x, int64_t rows, int64_t inter, int64_t row_stride, float *out);
void clamped_swiglu_bf16(const uint16_t *x, int64_t rows, int64_t inter, int64_t row_stride,
                         float alpha, float limit, uint16_t *out);
void clamped_swiglu_f32(const float *x, int64_t rows, int64_t inter, int64_t row_stride,
                        float alpha, float limit, float *out);
void argmax_f32(const float *x, int64_t rows, int64_t cols, int64_t *out);
void merge_attention_bf16(const uint16_t *x, const float *lx, const uint16_t *y, const float *ly,
                          int64_t tokens, int64_t heads, int64_t dim, uint16_t *out);

/* rope_kv.c (rope.py) */
int rope_write_kv_bf16(const uint16_t *qkv, int64_t tokens, int64_t token_stride,
                       int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                       const float *cos, const float *sin, uint16_t *cache, int64_t num_slots,
                       const int64_t *slot_mapping, uint16_t *q_out, uint16_t *k_out);

/* int8_rows.c (int8.py: int8_row_kernels) */
int quantize_rows_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride,
                       const float *inv_smooth, int8_t *q, float *scales);
int quantize_rows_f32(const float *x, int64_t rows, int64_t cols, int64_t row_stride,
                      const float *inv_smooth, int8_t *q, float *scales);
int quantize_row_pairs_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride,
                            const float *inv_smooth, int8_t *q, float *scales);
void dequantize_rows_bf16(const int32_t *acc, int64_t rows, int64_t cols,
                          const float *row_scales, const float *col_scales, const uint16_t *bias,
                          uint16_t *out);
void dequantize_rows_f32(const int32_t *acc, int64_t rows, int64_t cols, const float *row_scales,
                         const float *col_scales, const float *bias, float *out);

/* int8_gemm.c and int8_amx.c (int8.py: int8_gemm_kernels) */
int int8_gemm_available(void);
int64_t int8_packed_bytes(int64_t n, int64_t k);
int pack_int8_weights(const int8_t *w, int64_t n, int64_t k, int8_t *packed,
                      int32_t *compensation);
void int8_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                    const int8_t *packed, const int32_t *compensation, const float *col_scales,
                    const uint16_t *bias, int64_t n, uint16_t *out, int pairs,
                    int64_t amx_min_rows);
int int8_linear_bf16(const uint16_t *x, int64_t rows, int64_t k, int64_t x_stride,
                     const float *inv_smooth, const int8_t *packed, const int32_t *compensation,
                     const float *col_scales, const uint16_t *bias, int64_t n, uint16_t *out,
                     int pairs, int64_t amx_min_rows);
int int8_amx_available(void);
int int8_amx_gemm_bf16(const int8_t *q, const float *row_scales, int64_t rows, int64_t k,
                       const int8_t *packed, const float *col_scales, const uint16_t *bias,
                       int64_t n, uint16_t *out, int pairs);

/* decode_layer.c (fused_decode.py) */
int decoder_layer_rows_bf16(const DecoderLayer *layer, uint16_t *hidden, int64_t rows,
                            const float *cos, const float *sin, uint16_t *cache,
                            int64_t num_blocks, int64_t block_size, const int64_t *slot_mapping,
                            const int64_t *block_ids, int64_t blocks_per_seq,
                            const int64_t *seq_lens, const int64_t *amx_min_rows);

/* qblock_gemm.c (qblock.py): int8 activations times GGUF block codes */
int qblock_gemm_available(void);
int64_t qblock_super_bytes(int bits, int sub, int super_block, int has_scales, int has_min);
int qblock_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *packed,
                int64_t n, int bits, int sub, int super_block, int has_scales, int has_min,
                int offset, void *out, int out_bf16, int64_t out_stride);
int qblock_linear(const void *x, int x_bf16, int64_t rows, int64_t k, const QBlockPart *parts,
                  int64_t num_parts, void *out, int out_bf16, int64_t out_stride);
int qblock_rows(const uint8_t *packed, int64_t n, int64_t k, int bits, int sub, int super_block,
                int has_scales, int has_min, int offset, const int64_t *ids, int64_t count,
                float *out);

/* moe_qblock.c (qblock.py): an MoE layer's chosen experts in GGUF blocks, one call */
int qblock_moe(const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter,
               const QBlockExpert *experts, int64_t num_experts, const int64_t *expert_ids,
               const float *weights, int64_t top_k, float *out);

/* mxfp4_gemm.c (mxfp4.py): int8 activations times MXFP4 groups (gpt-oss's experts) */
int mxfp4_gemm_available(void);
int mxfp4_gemm(const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *weights,
               int64_t n, void *out, int out_bf16, int64_t out_stride);

/* moe_mxfp4.c (mxfp4.py): gpt-oss's MoE layer's chosen MXFP4 experts, one call */
int mxfp4_moe(const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter,
              const uint8_t *gate_up, const uint8_t *down, const void *gate_up_bias,
              const void *down_bias, int64_t num_experts, const int64_t *expert_ids,
              const float *weights, int64_t top_k, float alpha, float limit, float *out);


/* gated_delta.c and mamba_scan.c (recurrent.py): the hybrids' recurrences,
 * token by token per sequence and head (spans and saves: recurrent_spans.h) */
int gated_delta_rule_f32(const float *conv, const float *z, const float *b, const float *a,
                         const float *neg_a, const float *dt_bias, const float *norm_weight,
                         const int64_t *spans, int64_t num_seqs, const int64_t *saves,
                         int64_t num_saves, float *cache, int64_t cache_rows,
                         int64_t cache_stride, float *kept, int64_t kept_rows,
                         int64_t kept_stride, int64_t num_k_heads, int64_t num_v_heads,
                         int64_t key_head_dim, int64_t value_head_dim, float eps, int bf16,
                         float *out);
int mamba_scan_f32(const float *x, const float *dt, const float *decay, const float *b_in,
                   const float *c_out, const int64_t *spans, int64_t num_seqs,
                   const int64_t *saves, int64_t num_saves, float *cache, int64_t cache_rows,
                   int64_t cache_stride, float *kept, int64_t kept_rows, int64_t kept_stride,
                   int64_t num_heads, int64_t head_dim, int64_t num_groups, int64_t state_size,
                   float *y);

#endif
