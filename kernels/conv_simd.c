/* Built once per CPU path (cpu_path.h): the convolutions' output passes as
 * plain loops the compiler vectorises (GELU on libmvec's erff, as the linear
 * layers' epilogue, elementwise_simd.c). */
#include "conv_simd.h"
#include "simd_math.h"

#include <string.h>

SIMD_256_FN
void MS_SIMD_FN(conv_bias_act_row)(float *dst /* (n) */, const float *src /* (n) */, int n,
                                   float bias, ms_act act)
{
    if (act == MS_ACT_RELU) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float v = src[i] + bias;
            dst[i] = v > 0.0f ? v : 0.0f;
        }
    } else if (act == MS_ACT_NONE) {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = src[i] + bias;
    } else {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = simd_gelu(src[i] + bias);
    }
}

SIMD_256_FN
void MS_SIMD_FN(conv_acc_bias_act_row)(float *dst /* (n) */, const float *src /* (n) */,
                                       int n, float bias, ms_act act, bool last)
{
    if (!last) {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] += src[i];
        return;
    }
    if (act == MS_ACT_RELU) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float v = dst[i] + src[i] + bias;
            dst[i] = v > 0.0f ? v : 0.0f;
        }
    } else if (act == MS_ACT_NONE) {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = dst[i] + src[i] + bias;
    } else {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = simd_gelu(dst[i] + src[i] + bias);
    }
}

SIMD_256_FN
void MS_SIMD_FN(conv_bias_act_interleave)(float *dst /* (2n) */, const float *t0 /* (n) */,
                                          const float *t1 /* (n) */, int n, float bias,
                                          ms_act act)
{
    if (act == MS_ACT_RELU) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float a = t0[i] + bias, b = t1[i] + bias;
            dst[2 * i] = a > 0.0f ? a : 0.0f;
            dst[2 * i + 1] = b > 0.0f ? b : 0.0f;
        }
    } else if (act == MS_ACT_NONE) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            dst[2 * i] = t0[i] + bias;
            dst[2 * i + 1] = t1[i] + bias;
        }
    } else {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            dst[2 * i] = simd_gelu(t0[i] + bias);
            dst[2 * i + 1] = simd_gelu(t1[i] + bias);
        }
    }
}

/* Winograd F(4x4, 3x3) (Lavin & Gray, interpolation points 0, +-1, +-2):
 * the 1-D input transform B^T d of six values, and the output transform A^T m
 * to four. Written as sums of differences so that every coefficient is a
 * power of two (exact) and cancellation happens before the scaling. */
#define WINO_BT(d0, d1, d2, d3, d4, d5, t)                        \
    do {                                                          \
        float s12_ = (d1) + (d2), d12_ = (d1) - (d2);             \
        float s34_ = (d3) + (d4), d43_ = (d4) - (d3);             \
        float d31_ = (d3) - (d1), d42_ = (d4) - (d2);             \
        (t)[0] = 4.0f * ((d0) - (d2)) - ((d2) - (d4));            \
        (t)[1] = s34_ - 4.0f * s12_;                              \
        (t)[2] = d43_ + 4.0f * d12_;                              \
        (t)[3] = d42_ + 2.0f * d31_;                              \
        (t)[4] = d42_ - 2.0f * d31_;                              \
        (t)[5] = 4.0f * ((d1) - (d3)) - ((d3) - (d5));            \
    } while (0)

#define WINO_AT(m0, m1, m2, m3, m4, m5, o)                        \
    do {                                                          \
        float s12_ = (m1) + (m2), d12_ = (m1) - (m2);             \
        float s34_ = (m3) + (m4), d34_ = (m3) - (m4);             \
        (o)[0] = (m0) + s12_ + s34_;                              \
        (o)[1] = d12_ + 2.0f * d34_;                              \
        (o)[2] = s12_ + 4.0f * s34_;                              \
        (o)[3] = d12_ + 8.0f * d34_ + (m5);                       \
    } while (0)

void MS_SIMD_FN(wino43_input_row)(float *v /* (36, kst) */, size_t kst,
                                  const float *const d[6] /* 6 x (wd) */, float *t /* (6, wp) */,
                                  int wd, int tw)
{
    const int wp = 4 * tw + 2;
    const float *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3], *d4 = d[4], *d5 = d[5];
    float *t0 = t, *t1 = t + wp, *t2 = t + 2 * wp, *t3 = t + 3 * wp, *t4 = t + 4 * wp,
          *t5 = t + 5 * wp;
    /* B^T along y over whole rows (column x of the image is t's x + 1; the
     * pad column before it and the columns after it are zero) */
#pragma omp simd
    for (int x = 0; x < wd; x++) {
        float r[6];
        WINO_BT(d0[x], d1[x], d2[x], d3[x], d4[x], d5[x], r);
        t0[x + 1] = r[0]; t1[x + 1] = r[1]; t2[x + 1] = r[2];
        t3[x + 1] = r[3]; t4[x + 1] = r[4]; t5[x + 1] = r[5];
    }
    for (int i = 0; i < 6; i++) {
        float *ti = t + (size_t)i * wp;
        ti[0] = 0.0f;
        for (int x = wd + 1; x < wp; x++) ti[x] = 0.0f;
    }
    /* then along x, one tile (six columns from 4 x) per lane */
    for (int i = 0; i < 6; i++) {
        const float *ti = t + (size_t)i * wp;
        float *vi = v + (size_t)(6 * i) * kst;
#pragma omp simd
        for (int x = 0; x < tw; x++) {
            const float *c = ti + 4 * x;
            float r[6];
            WINO_BT(c[0], c[1], c[2], c[3], c[4], c[5], r);
            vi[x] = r[0];
            vi[kst + x] = r[1];
            vi[2 * kst + x] = r[2];
            vi[3 * kst + x] = r[3];
            vi[4 * kst + x] = r[4];
            vi[5 * kst + x] = r[5];
        }
    }
}

void MS_SIMD_FN(wino43_output_row)(float *y /* (4, 4 tw) */, const float *m /* (36, kst) */,
                                   size_t kst, int tw)
{
    const int yw = 4 * tw;
#pragma omp simd
    for (int x = 0; x < tw; x++) {
        float z[4][6]; /* A^T m: along y (p) first, for each column q */
        for (int q = 0; q < 6; q++) {
            const float *mq = m + (size_t)q * kst + x;
            float o[4];
            WINO_AT(mq[0], mq[6 * kst], mq[12 * kst], mq[18 * kst], mq[24 * kst], mq[30 * kst],
                    o);
            z[0][q] = o[0]; z[1][q] = o[1]; z[2][q] = o[2]; z[3][q] = o[3];
        }
        for (int i = 0; i < 4; i++) {
            float o[4];
            WINO_AT(z[i][0], z[i][1], z[i][2], z[i][3], z[i][4], z[i][5], o);
            float *yi = y + (size_t)i * yw + 4 * x;
            yi[0] = o[0]; yi[1] = o[1]; yi[2] = o[2]; yi[3] = o[3];
        }
    }
}

/* U_k (k = 6 i + j) = (G g G^T)[i][j] of one output channel's ci kernels g,
 * into u[k * kst + c], with G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6;
 * 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]. */
void MS_SIMD_FN(wino43_weights_row)(float *u /* (36, kst) */, size_t kst,
                                    const float *w /* (ci, 3, 3) */, int ci)
{
    enum { CB = 64 }; /* kernels per block: its 9 taps and 36 results stay in L1 */
    float g[9][CB], r[36][CB];
    for (int c0 = 0; c0 < ci; c0 += CB) {
        int nc = ci - c0 < CB ? ci - c0 : CB;
        for (int c = 0; c < nc; c++) /* taps as planes, for unit-stride lanes */
            for (int q = 0; q < 9; q++) g[q][c] = w[(size_t)(c0 + c) * 9 + q];
        /* G g G^T, columns then rows, with one 1-D transform G x of three
         * values into six named temporaries p0..p5 (no local arrays, so the
         * loop vectorises) */
#define WINO_G(p, x0, x1, x2)                                              \
    const float p##0 = 0.25f * (x0), p##1 = -((x0) + (x1) + (x2)) * sixth, \
                p##2 = -((x0) - (x1) + (x2)) * sixth,                      \
                p##3 = (0.25f * (x0) + 0.5f * (x1) + (x2)) * sixth,        \
                p##4 = (0.25f * (x0) - 0.5f * (x1) + (x2)) * sixth, p##5 = (x2)
#define WINO_G_ROW(i)                                                      \
    do {                                                                   \
        WINO_G(q, s##i, t##i, v##i);                                       \
        r[6 * i + 0][c] = q0;                                              \
        r[6 * i + 1][c] = q1;                                              \
        r[6 * i + 2][c] = q2;                                              \
        r[6 * i + 3][c] = q3;                                              \
        r[6 * i + 4][c] = q4;                                              \
        r[6 * i + 5][c] = q5;                                              \
    } while (0)
        const float sixth = 1.0f / 6.0f;
#pragma omp simd
        for (int c = 0; c < nc; c++) {
            /* G g: column j of g (its taps g[j], g[3+j], g[6+j]) into column
             * j of G g (s, t, v for j = 0, 1, 2) */
            WINO_G(s, g[0][c], g[3][c], g[6][c]);
            WINO_G(t, g[1][c], g[4][c], g[7][c]);
            WINO_G(v, g[2][c], g[5][c], g[8][c]);
            /* then each row i of G g through G again */
            WINO_G_ROW(0);
            WINO_G_ROW(1);
            WINO_G_ROW(2);
            WINO_G_ROW(3);
            WINO_G_ROW(4);
            WINO_G_ROW(5);
        }
#undef WINO_G_ROW
#undef WINO_G
        /* each U_k row a contiguous run (36 rows kst apart) */
        for (int k = 0; k < 36; k++)
            memcpy(u + (size_t)k * kst + c0, r[k], (size_t)nc * sizeof(float));
    }
}
