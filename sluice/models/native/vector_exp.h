/* expf as plain arithmetic that gcc vectorises: the library's expf is a call
 * per element here (its vector variant is declared only under full
 * -ffast-math, which our -fno-finite-math-only turns off), and that call was
 * most of a softmax's time.
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2],
 * exp(r) from Cephes' degree-6 polynomial: within 2 ulp of float32's exp over
 * the clamped range [-87.3, 88.7] (beyond it float32's exp is 0, a denormal
 * or inf). -inf gives 0 (softmax's masked entries); NaN stays NaN. */
#ifndef SLUICE_VECTOR_EXP_H
#define SLUICE_VECTOR_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float vector_expf(float x) {
    const float clamped = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    const float n = rintf(clamped * 1.44269504088896341f);
    const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float poly = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float y = poly * scale;
    /* Below the range: 0 (as exp(-inf) is); NaN in, NaN out. */
    return x < -87.3f ? 0.0f : (x != x ? x : y);
}

#endif
