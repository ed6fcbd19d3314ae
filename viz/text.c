/* Glyph atlas from SDL2_ttf, blended into RGBA buffers by hand. */
#include "text.h"

#include <SDL.h>
#include <SDL_ttf.h>
#include <stdlib.h>
#include <string.h>

#define FIRST_GLYPH 32
#define N_GLYPHS 95 /* ' ' .. '~' */

typedef struct {
    int w, h;           /* bitmap size (h = font height) */
    int advance;
    uint8_t *alpha;     /* (h, w) coverage */
} glyph;

struct viz_font {
    int height;
    glyph g[N_GLYPHS];
};

const char *viz_font_path(void)
{
    const char *env = getenv("MITASEG_FONT");
    return env && *env ? env : VIZ_FONT_DEFAULT;
}

void viz_font_free(viz_font *f)
{
    if (!f) return;
    for (int i = 0; i < N_GLYPHS; i++) free(f->g[i].alpha);
    free(f);
    TTF_Quit();
}

/* Copies a rendered glyph's alpha out of its ARGB8888 surface. */
static ms_status glyph_from_surface(glyph *g, SDL_Surface *s)
{
    SDL_Surface *conv = SDL_ConvertSurfaceFormat(s, SDL_PIXELFORMAT_ARGB8888, 0);
    if (!conv) return ms_error(MS_ERR_FORMAT, "SDL_ConvertSurfaceFormat: %s", SDL_GetError());
    g->w = conv->w;
    g->h = conv->h;
    g->alpha = malloc((size_t)g->w * g->h + 1);
    if (!g->alpha) {
        SDL_FreeSurface(conv);
        MS_CHECK_ALLOC(g->alpha, (size_t)g->w * g->h + 1);
    }
    if (SDL_MUSTLOCK(conv)) SDL_LockSurface(conv);
    for (int y = 0; y < g->h; y++) {
        const uint32_t *row = (const uint32_t *)((const uint8_t *)conv->pixels + (size_t)y * conv->pitch);
        for (int x = 0; x < g->w; x++) g->alpha[(size_t)y * g->w + x] = (uint8_t)(row[x] >> 24);
    }
    if (SDL_MUSTLOCK(conv)) SDL_UnlockSurface(conv);
    SDL_FreeSurface(conv);
    return MS_OK;
}

ms_status viz_font_open(viz_font **out, const char *path, int px)
{
    *out = NULL;
    if (TTF_Init() != 0) return ms_error(MS_ERR_UNSUPPORTED, "TTF_Init: %s", TTF_GetError());
    viz_font *f = calloc(1, sizeof *f);
    if (!f) {
        TTF_Quit();
        MS_CHECK_ALLOC(f, sizeof *f);
    }
    TTF_Font *ttf = TTF_OpenFont(path, px);
    if (!ttf) {
        viz_font_free(f);
        return ms_error(MS_ERR_IO, "%s: cannot open font: %s", path, TTF_GetError());
    }
    f->height = TTF_FontHeight(ttf);
    SDL_Color white = {255, 255, 255, 255};
    for (int i = 0; i < N_GLYPHS; i++) {
        uint16_t ch = (uint16_t)(FIRST_GLYPH + i);
        int minx, maxx, miny, maxy, adv;
        if (TTF_GlyphMetrics(ttf, ch, &minx, &maxx, &miny, &maxy, &adv) != 0) adv = px / 2;
        f->g[i].advance = adv;
        if (ch == ' ') continue;
        SDL_Surface *s = TTF_RenderGlyph_Blended(ttf, ch, white);
        if (!s) continue; /* a glyph the font lacks draws nothing */
        ms_status st = glyph_from_surface(&f->g[i], s);
        SDL_FreeSurface(s);
        if (st != MS_OK) {
            TTF_CloseFont(ttf);
            viz_font_free(f);
            return ms_error_prefix(st, "%s", path);
        }
    }
    TTF_CloseFont(ttf);
    *out = f;
    return MS_OK;
}

int viz_font_height(const viz_font *f) { return f ? f->height : 0; }

/* Index of the glyph for byte c; UTF-8 continuation bytes return -1 (skipped)
 * so a multi-byte character draws one '?'. */
static int glyph_index(unsigned char c)
{
    if (c >= FIRST_GLYPH && c < FIRST_GLYPH + N_GLYPHS) return c - FIRST_GLYPH;
    if ((c & 0xC0) == 0x80) return -1;
    return '?' - FIRST_GLYPH;
}

int viz_text_width(const viz_font *f, const char *s)
{
    if (!f || !s) return 0;
    int w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int gi = glyph_index(*p);
        if (gi >= 0) w += f->g[gi].advance;
    }
    return w;
}

int viz_text_draw(uint8_t *rgba, int W, int H, const viz_font *f, int x, int y, const char *s,
                  const uint8_t rgb[3])
{
    if (!f || !s) return x;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int gi = glyph_index(*p);
        if (gi < 0) continue;
        const glyph *g = &f->g[gi];
        for (int gy = 0; g->alpha && gy < g->h; gy++) {
            int py = y + gy;
            if (py < 0 || py >= H) continue;
            for (int gx = 0; gx < g->w; gx++) {
                int px = x + gx;
                if (px < 0 || px >= W) continue;
                unsigned a = g->alpha[(size_t)gy * g->w + gx];
                if (!a) continue;
                uint8_t *d = rgba + ((size_t)py * W + px) * 4;
                for (int ch = 0; ch < 3; ch++)
                    d[ch] = (uint8_t)((d[ch] * (255 - a) + rgb[ch] * a + 127) / 255);
            }
        }
        x += g->advance;
    }
    return x;
}
