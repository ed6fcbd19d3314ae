/* Colour maps. The viridis/magma coefficients are mattz's CC0 minimax fits
 * (shadertoy WlfXRN) to the BIDS colormap tables. They stray from the tables by
 * up to about 0.02 per channel, worst at the ends (tests/test_viz_render.c
 * checks published entries); invisible in a heatmap. */
#include "colormap.h"

#include <math.h>

static const float viridis_c[7][3] = {
    {0.2777273272234177f, 0.005407344544966578f, 0.3340998053353061f},
    {0.1050930431085774f, 1.404613529898575f, 1.384590162594685f},
    {-0.3308618287255563f, 0.214847559468213f, 0.09509516302823659f},
    {-4.634230498983486f, -5.799100973351585f, -19.33244095627987f},
    {6.228269936347081f, 14.17993336680509f, 56.69055260068105f},
    {4.776384997670288f, -13.74514537774601f, -65.35303263337234f},
    {-5.435455855934631f, 4.645852612178535f, 26.3124352495832f},
};

static const float magma_c[7][3] = {
    {-0.002136485053939582f, -0.000749655052795221f, -0.005386127855323933f},
    {0.2516605407371642f, 0.6775232436837668f, 2.494026599312351f},
    {8.353717279216625f, -3.577719514958484f, 0.3144679030132573f},
    {-27.66873308576866f, 14.26473078096533f, -13.64921318813922f},
    {52.17613981234068f, -27.94360607168351f, 12.94416944238394f},
    {-50.76852536473588f, 29.04658282127291f, 4.23415299384598f},
    {18.65570506591883f, -11.48977351997711f, -5.601961508734096f},
};

static uint8_t to_byte(float v)
{
    v = v < 0 ? 0 : v > 1 ? 1 : v;
    return (uint8_t)lrintf(v * 255.0f);
}

static void poly_map(uint8_t rgb[3], const float c[7][3], float t)
{
    if (!(t >= 0)) t = 0; /* also NaN */
    if (t > 1) t = 1;
    for (int ch = 0; ch < 3; ch++) {
        float v = c[6][ch]; /* Horner */
        for (int i = 5; i >= 0; i--) v = v * t + c[i][ch];
        rgb[ch] = to_byte(v);
    }
}

void viz_viridis(uint8_t rgb[3], float t) { poly_map(rgb, viridis_c, t); }
void viz_magma(uint8_t rgb[3], float t) { poly_map(rgb, magma_c, t); }

void viz_hsv(uint8_t rgb[3], float h, float s, float v)
{
    h = h - floorf(h);
    float f = h * 6.0f;
    int i = (int)f % 6;
    float fr = f - floorf(f);
    float p = v * (1 - s), q = v * (1 - s * fr), u = v * (1 - s * (1 - fr));
    float r, g, b;
    switch (i) {
    case 0: r = v; g = u; b = p; break;
    case 1: r = q; g = v; b = p; break;
    case 2: r = p; g = v; b = u; break;
    case 3: r = p; g = q; b = v; break;
    case 4: r = u; g = p; b = v; break;
    default: r = v; g = p; b = q; break;
    }
    rgb[0] = to_byte(r);
    rgb[1] = to_byte(g);
    rgb[2] = to_byte(b);
}

void viz_expert_color(uint8_t rgb[3], int e)
{
    /* golden-ratio hue steps never repeat and keep consecutive experts apart */
    float h = (float)e * 0.6180339887f;
    float s = (e % 3 == 1) ? 0.45f : 0.8f;
    float v = (e % 2) ? 0.72f : 0.98f;
    viz_hsv(rgb, h, s, v);
}
