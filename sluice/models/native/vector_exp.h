/* expf as plain arithmetic that gcc vectorises: the library's expf is a call
 * per element here (its vector variant is declared only under full
 * -ffast-math, which our -fno-finite-math-only turns off), and that call was
 * most of a softmax's time.
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2],
 * exp(r) from Cephes' degree-6 polynomial: within 2 ulp of float32's exp over
 * the clamped range [-87.3, 88.7] (beyond it float32's exp is 0, a denormal
 * or inf). -inf gives 0 (softmax's masked entries); NaN stays NaN. `exp16`
 * is the same on 16 lanes with AVX-512, for the attention kernels. */
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

#if defined(__AVX512F__)
#include <immintrin.h>

/* The same polynomial on 16 lanes with AVX-512, for x <= 0 (softmax's scores
 * minus their maximum): lanes below -87.3 (and -inf) give 0. */
static inline __m512 exp16(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 poly = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
                                      _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(poly, n));
}
#endif

#endif
