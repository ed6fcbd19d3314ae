/* Colour maps for the viewer, computed rather than read from image files. */
#ifndef MS_VIZ_COLORMAP_H
#define MS_VIZ_COLORMAP_H

#include <stdint.h>

/* Perceptually uniform maps, t in [0, 1] (clamped): degree-6 polynomial fits
 * to matplotlib's viridis and magma tables. */
void viz_viridis(uint8_t rgb[3], float t);
void viz_magma(uint8_t rgb[3], float t);
/* A distinct colour for expert e: hues spread by the golden angle, with
 * alternating value and saturation so neighbours in the landmark grid differ. */
void viz_expert_color(uint8_t rgb[3], int e);
/* HSV (h in turns, s, v in [0, 1]) to 8-bit RGB. */
void viz_hsv(uint8_t rgb[3], float h, float s, float v);

#endif
