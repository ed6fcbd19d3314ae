/* Text for the renderer: a TrueType font (SDL2_ttf, no window needed) whose
 * printable ASCII glyphs are rasterised once at open and then blended into
 * RGBA buffers by plain loops, so drawing needs no SDL state. */
#ifndef MS_VIZ_TEXT_H
#define MS_VIZ_TEXT_H

#include "kernels/common.h"

/* DejaVu Sans from Debian's fonts-dejavu-core. */
#define VIZ_FONT_DEFAULT "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

typedef struct viz_font viz_font;

/* Opens path at px pixels (TTF_Init is reference-counted: pair with
 * viz_font_free). Errors name the file. */
ms_status viz_font_open(viz_font **out, const char *path, int px);
void viz_font_free(viz_font *f);
/* $MITASEG_FONT when set, else VIZ_FONT_DEFAULT. */
const char *viz_font_path(void);

int viz_font_height(const viz_font *f);
/* Width in pixels of s drawn with f (bytes outside printable ASCII draw '?'). */
int viz_text_width(const viz_font *f, const char *s);
/* Draws s with its top-left at (x, y), clipped to the buffer; returns the
 * pen x after the text. */
int viz_text_draw(uint8_t *rgba /* (H, W, 4) */, int W, int H, const viz_font *f, int x, int y,
                  const char *s, const uint8_t rgb[3]);

#endif
