/* For the *_simd.c files only (cpu_path.h): libmvec's vector expf and erff
 * made callable from `#pragma omp simd` loops (glibc declares them only under
 * -ffast-math, which we do not want elsewhere; glibc documents at most 1-2
 * ulp for them), the exact GELU on that erff, and an inlined 2^x (the
 * softmaxes of full attention and MiTA). */
#ifndef MS_SIMD_MATH_H
#define MS_SIMD_MATH_H

#include <math.h>
#include <stdint.h>

#pragma omp declare simd notinbranch
extern float expf(float);
#pragma omp declare simd notinbranch
extern float erff(float);

/* Marks a function that the v4 path builds for 256-bit vectors, as v3
 * does (its other loops take 512-bit ones). For those whose loops call
 * erff: libmvec's 16-lane erff was measured 3.4 ulp off near erf = -1
 * (GELU(-5.198) came out -0 for -5.2e-7; tests/test_ops_elem.c), its
 * 8-lane one within glibc's 1-2. For loops over a few dozen values, where
 * a 512-bit vector's tail costs more than it saves (comment at each). */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define SIMD_256_FN __attribute__((target("prefer-vector-width=256")))
#else
#define SIMD_256_FN
#endif

/* gelu_erf (linear.h) written out here, so that erff is the vector one. */
static inline float simd_gelu(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

/* Bits of -127.0f and of 126.0f. */
#define EXP2_LOW_BITS 0xC2FE0000u
#define EXP2_HIGH_BITS 0x42FC0000
/* 2^f on [-1/2, 1/2], highest power first: every form below uses these */
#define EXP2_C6 1.5353361960e-4f
#define EXP2_C5 1.3398875017e-3f
#define EXP2_C4 9.6184369177e-3f
#define EXP2_C3 5.5503323674e-2f
#define EXP2_C2 2.4022647738e-1f
#define EXP2_C1 6.9314718246e-1f
#define EXP2_ROUND 12582912.0f /* 1.5 * 2^23: x + it - it rounds x to an integer */

/* 2^x for x <= 126, inlined so the row loops vectorise into straight-line
 * code: 20 vector instructions per 8 values, load, store and sum included,
 * 0.27 ns a value against libmvec's expf at 0.48 (called per vector; it
 * was three quarters of full attention's softmax time and an eighth of
 * the op's) on the v3 path. x = n + f, n an integer and |f| <= 1/2 exactly; 2^f by a
 * degree-6 polynomial (fitted for relative error on [-1/2, 1/2]: 1e-7, under
 * 2 ulp with float rounding); 2^n put into the exponent bits. Below -126.5
 * (and at -inf) it returns 0, where exp2f is below 1.7e-38; above 126 (and
 * for NaN) 2^126: callers check the row max and NaN for that.
 * The clamps are integer mins on the bits: read as signed, positive floats
 * grow with their value; read as unsigned, negative ones grow with their
 * magnitude (and lie above every positive one). A float select would not
 * vectorise without -fno-trapping-math. At n = -127 the exponent bits make
 * 2^n = 0. */
static inline float exp2_clamped(float x)
{
    union {
        float f;
        int32_t i;
        uint32_t u;
    } v = {.f = x};
    v.i = v.i < EXP2_HIGH_BITS ? v.i : EXP2_HIGH_BITS;
    v.u = v.u < EXP2_LOW_BITS ? v.u : EXP2_LOW_BITS;
    /* round to nearest by adding and taking away 1.5 * 2^23 (plain float
     * adds; rintf has no vector form before SSE4.1) */
    float n = (v.f + EXP2_ROUND) - EXP2_ROUND;
    float f = v.f - n;
    float p = EXP2_C6;
    p = p * f + EXP2_C5;
    p = p * f + EXP2_C4;
    p = p * f + EXP2_C3;
    p = p * f + EXP2_C2;
    p = p * f + EXP2_C1;
    p = p * f + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* exp2_clamped on 8 lanes, for loops with masked tails: the same clamps,
 * rounding (to nearest, by the same adds), polynomial (with fused
 * multiply-adds) and 2^n by the exponent bits as the scalar form. */
static inline __m256 exp2_clamped_v8(__m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    b = _mm256_min_epi32(b, _mm256_set1_epi32(EXP2_HIGH_BITS));
    b = _mm256_min_epu32(b, _mm256_set1_epi32((int32_t)EXP2_LOW_BITS));
    __m256 v = _mm256_castsi256_ps(b);
    __m256 n = _mm256_sub_ps(_mm256_add_ps(v, _mm256_set1_ps(EXP2_ROUND)),
                             _mm256_set1_ps(EXP2_ROUND));
    __m256 f = _mm256_sub_ps(v, n);
    __m256 p = _mm256_set1_ps(EXP2_C6);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_slli_epi32(e, 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lanes [0, t) set, for masked loads and stores of a tail of t < 8. */
static inline __m256i tail_mask8(int t)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum8(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
#endif

#ifdef __AVX512F__
#include <immintrin.h>
/* exp2_clamped on 16 lanes, written out for loops whose 512-bit tails the
 * compiler would leave scalar: the same clamps and the same polynomial,
 * with fused multiply-adds, and 2^n applied by scalef (one instruction for
 * four; at n = -127 it gives p 2^-127, where the scalar form gives 0). So
 * within rounding of the scalar form, not bit-equal to it. */
static inline __m512 exp2_clamped_v16(__m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    b = _mm512_min_epi32(b, _mm512_set1_epi32(EXP2_HIGH_BITS));
    b = _mm512_min_epu32(b, _mm512_set1_epi32((int32_t)EXP2_LOW_BITS));
    __m512 v = _mm512_castsi512_ps(b);
    __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(v, n);
    __m512 p = _mm512_set1_ps(EXP2_C6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
