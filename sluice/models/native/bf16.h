/* bfloat16 <-> float32 for the kernels here: a bfloat16 is the top half of a
 * float32, so loading is exact; storing rounds to nearest even, and NaN stays
 * a (quiet) NaN. Branch-free, so loops over them vectorise. */
#ifndef SLUICE_BF16_H
#define SLUICE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_load(const uint16_t *p) {
    uint32_t u = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f rounded to the nearest bfloat16 value, as a float32. */
static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t nan = (u | 0x400000u) & 0xffff0000u;
    u = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void bf16_store(uint16_t *p, float f) {
    uint32_t u;
    f = bf16_round(f);
    memcpy(&u, &f, sizeof u);
    *p = (uint16_t)(u >> 16);
}

static inline float f32_load(const float *p) { return *p; }
static inline void f32_store(float *p, float f) { *p = f; }
static inline float f32_round(float f) { return f; }

#endif
