/* PNG and JPEG in (every colour type to 8-bit RGB), PNG out (atomic).
 *
 * libpng and libjpeg report errors by longjmp. Each decoder keeps its state in
 * a context struct owned by the caller and does the setjmp in a small
 * function of its own, so no local variable is live across a longjmp and the
 * caller frees whatever was allocated, success or not. Neither library
 * prints: their message hooks store the text in the context. */
#include "image_io.h"
#include "file_io.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

/* Limits checked before any pixel buffer is allocated. */
#define MS_IMG_MAX_SIDE 65535
#define MS_IMG_MAX_PIXELS ((uint64_t)1 << 28)

static ms_status check_size(const char *path, uint64_t w, uint64_t h)
{
    if (w == 0 || h == 0) return ms_error(MS_ERR_FORMAT, "%s: empty image (%llux%llu)", path,
                                          (unsigned long long)w, (unsigned long long)h);
    if (w > MS_IMG_MAX_SIDE || h > MS_IMG_MAX_SIDE || w * h > MS_IMG_MAX_PIXELS)
        return ms_error(MS_ERR_FORMAT, "%s: image too large (%llux%llu)", path, (unsigned long long)w,
                        (unsigned long long)h);
    return MS_OK;
}

/* ------------------------------------------------------------------ PNG */

typedef struct {
    const char *path;
    FILE *f;
    png_structp png;
    png_infop info;
    jmp_buf jb;
    char msg[256];
    /* Which libpng call was running when it failed (the call-site macro). */
    const char *call;
    int line;
    ms_status st;      /* set before png_error by our own checks */
    image_size_check check; /* caller's check of the size, or NULL */
    void *check_user;
    uint8_t *buf;      /* decoded rows, (h, rowbytes) */
    png_bytep *rows;   /* (h) */
    png_uint_32 w, h;
    int channels;
    bool label;        /* raw 8-bit indices/grey, no expansion */
} png_ctx;

/* Records the call and line of each libpng/libjpeg call so an error says
 * where it happened: "(png_read_info, image_io.c:123)". */
#define PNG_CALL(c, fn, ...) ((c)->call = #fn, (c)->line = __LINE__, fn(__VA_ARGS__))
#define JPEG_CALL PNG_CALL
#ifdef __FILE_NAME__
#define MS_SRC_FILE __FILE_NAME__
#else
#define MS_SRC_FILE __FILE__
#endif

static void png_on_error(png_structp png, png_const_charp msg)
{
    png_ctx *c = png_get_error_ptr(png);
    if (c->msg[0] == '\0') snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

/* Reads with an explicit "truncated" message instead of libpng's "Read Error". */
static void png_on_read(png_structp png, png_bytep data, size_t n)
{
    png_ctx *c = png_get_io_ptr(png);
    size_t got = fread(data, 1, n, c->f);
    if (got != n) {
        if (ferror(c->f)) snprintf(c->msg, sizeof c->msg, "read error: %s", strerror(errno));
        else snprintf(c->msg, sizeof c->msg, "file truncated");
        png_error(png, c->msg);
    }
}

static const char *png_color_name(int ct)
{
    switch (ct) {
    case PNG_COLOR_TYPE_GRAY: return "grey";
    case PNG_COLOR_TYPE_GRAY_ALPHA: return "grey+alpha";
    case PNG_COLOR_TYPE_PALETTE: return "palette";
    case PNG_COLOR_TYPE_RGB: return "RGB";
    case PNG_COLOR_TYPE_RGB_ALPHA: return "RGBA";
    default: return "unknown";
    }
}

/* The part that may longjmp. Returns 0 on success, 1 after a libpng error or
 * a failed check of ours (c->st and c->msg say which). */
static int png_decode(png_ctx *c)
{
    if (setjmp(png_jmpbuf(c->png))) return 1;
    PNG_CALL(c, png_set_read_fn, c->png, c, png_on_read);
    /* Our own size limit below gives the clearer message; let libpng accept
     * anything the format allows. */
    PNG_CALL(c, png_set_user_limits, c->png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    PNG_CALL(c, png_read_info, c->png, c->info);
    c->w = png_get_image_width(c->png, c->info);
    c->h = png_get_image_height(c->png, c->info);
    if (check_size(c->path, c->w, c->h) != MS_OK) {
        c->st = MS_ERR_FORMAT;
        snprintf(c->msg, sizeof c->msg, "image too large (%lux%lu)", (unsigned long)c->w, (unsigned long)c->h);
        return 1;
    }
    if (c->check && (c->st = c->check(c->check_user, (int)c->w, (int)c->h)) != MS_OK) {
        snprintf(c->msg, sizeof c->msg, "%s", ms_last_error());
        return 1;
    }
    int ct = png_get_color_type(c->png, c->info), bd = png_get_bit_depth(c->png, c->info);
    if (c->label) {
        if ((ct != PNG_COLOR_TYPE_GRAY && ct != PNG_COLOR_TYPE_PALETTE) || bd > 8) {
            c->st = MS_ERR_FORMAT;
            snprintf(c->msg, sizeof c->msg, "label image must be grey or palette (at most 8-bit), got %s %d-bit",
                     png_color_name(ct), bd);
            return 1;
        }
        /* One byte per pixel, raw values: no palette expansion, no scaling
         * of low-depth grey. */
        if (bd < 8) PNG_CALL(c, png_set_packing, c->png);
    } else {
        if (bd == 16) PNG_CALL(c, png_set_scale_16, c->png);
        if (ct == PNG_COLOR_TYPE_PALETTE) PNG_CALL(c, png_set_palette_to_rgb, c->png);
        if ((ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) && bd < 8)
            PNG_CALL(c, png_set_expand_gray_1_2_4_to_8, c->png);
        if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) PNG_CALL(c, png_set_gray_to_rgb, c->png);
        /* Alpha (and tRNS, which palette expansion turns into alpha) is
         * dropped when the rows are packed to RGB below, not composited. */
    }
    PNG_CALL(c, png_set_interlace_handling, c->png);
    PNG_CALL(c, png_read_update_info, c->png, c->info);
    c->channels = png_get_channels(c->png, c->info);
    size_t rowbytes = png_get_rowbytes(c->png, c->info);
    int want_ch = c->label ? 1 : -1;
    if (png_get_bit_depth(c->png, c->info) != 8 || (want_ch > 0 && c->channels != want_ch) ||
        (want_ch < 0 && c->channels != 3 && c->channels != 4) || rowbytes != (size_t)c->w * (size_t)c->channels) {
        c->st = MS_ERR_FORMAT;
        snprintf(c->msg, sizeof c->msg, "unsupported PNG layout after conversion (%d channels)", c->channels);
        return 1;
    }
    c->buf = malloc(rowbytes * c->h);
    c->rows = malloc(sizeof *c->rows * c->h);
    if (!c->buf || !c->rows) {
        c->st = MS_ERR_OOM;
        snprintf(c->msg, sizeof c->msg, "out of memory for %lux%lu pixels", (unsigned long)c->w,
                 (unsigned long)c->h);
        return 1;
    }
    for (png_uint_32 y = 0; y < c->h; y++) c->rows[y] = c->buf + (size_t)y * rowbytes;
    PNG_CALL(c, png_read_image, c->png, c->rows);
    /* Reading to IEND catches a file cut after the image data. */
    PNG_CALL(c, png_read_end, c->png, NULL);
    return 0;
}

/* Opens, decodes and closes; on success c->buf holds (h, w, channels). */
static ms_status png_read_file(png_ctx *c, FILE *f)
{
    c->f = f;
    c->call = "libpng";
    c->st = MS_ERR_FORMAT;
    c->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
    if (c->png) c->info = png_create_info_struct(c->png);
    if (!c->png || !c->info) {
        png_destroy_read_struct(c->png ? &c->png : NULL, NULL, NULL);
        return ms_error(MS_ERR_OOM, "%s: out of memory creating the PNG reader (%s:%d)", c->path, MS_SRC_FILE,
                        __LINE__);
    }
    c->st = MS_OK;
    int failed = png_decode(c);
    png_destroy_read_struct(&c->png, &c->info, NULL);
    free(c->rows);
    c->rows = NULL;
    if (failed) {
        free(c->buf);
        c->buf = NULL;
        if (c->st != MS_OK) return ms_error(c->st, "%s: %s", c->path, c->msg);
        return ms_error(MS_ERR_FORMAT, "%s: invalid PNG: %s (%s, %s:%d)", c->path, c->msg, c->call, MS_SRC_FILE,
                        c->line);
    }
    return MS_OK;
}

/* ----------------------------------------------------------------- JPEG */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

typedef struct {
    const char *path;
    FILE *f;
    struct jpeg_decompress_struct cinfo;
    jpeg_err err;
    bool created;
    ms_status st;
    char msg[256];
    const char *call; /* the libjpeg call running when it failed */
    int line;
    uint8_t *rgb;     /* (h, w, 3) before orientation */
    uint8_t *row;     /* one scanline as decoded */
    int w, h;
    int orientation;  /* EXIF 1..8 */
    image_size_check check; /* caller's check of the size, or NULL */
    void *check_user;
} jpeg_ctx;

static void jpeg_on_error(j_common_ptr cinfo)
{
    jpeg_err *e = (jpeg_err *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings that mean missing or corrupt pixel data become errors (libjpeg
 * would otherwise fill the gap with grey and carry on); the rest, like
 * "extraneous bytes before marker", are harmless and ignored. */
static void jpeg_on_message(j_common_ptr cinfo, int level)
{
    if (level >= 0) return; /* trace messages */
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_BOGUS_PROGRESSION:
        jpeg_on_error(cinfo);
        break;
    default:
        break;
    }
}

static void jpeg_no_output(j_common_ptr cinfo) { (void)cinfo; }

static unsigned exif_u16(const uint8_t *p, bool le) { return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
static uint32_t exif_u32(const uint8_t *p, bool le)
{
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The EXIF orientation (tag 0x0112 in IFD0) of an APP1 payload; 1 when
 * absent or malformed (a bad EXIF block is not worth failing the image). */
static int exif_orientation(const uint8_t *d, size_t n)
{
    if (n < 14 || memcmp(d, "Exif\0\0", 6) != 0) return 1;
    const uint8_t *t = d + 6; /* TIFF header; offsets are relative to it */
    size_t tn = n - 6;
    bool le;
    if (t[0] == 'I' && t[1] == 'I') le = true;
    else if (t[0] == 'M' && t[1] == 'M') le = false;
    else return 1;
    if (exif_u16(t + 2, le) != 42) return 1;
    uint32_t ifd = exif_u32(t + 4, le);
    if (ifd > tn || tn - ifd < 2) return 1;
    unsigned count = exif_u16(t + ifd, le);
    for (unsigned i = 0; i < count; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e + 12 > tn) return 1;
        if (exif_u16(t + e, le) == 0x0112) {
            /* SHORT, count 1: the value sits in the first 2 bytes of the field. */
            if (exif_u16(t + e + 2, le) != 3 || exif_u32(t + e + 4, le) != 1) return 1;
            unsigned v = exif_u16(t + e + 8, le);
            return (v >= 1 && v <= 8) ? (int)v : 1;
        }
    }
    return 1;
}

static int jpeg_decode(jpeg_ctx *c)
{
    struct jpeg_decompress_struct *ci = &c->cinfo;
    ci->err = jpeg_std_error(&c->err.pub);
    c->err.pub.error_exit = jpeg_on_error;
    c->err.pub.emit_message = jpeg_on_message;
    c->err.pub.output_message = jpeg_no_output;
    if (setjmp(c->err.jb)) {
        snprintf(c->msg, sizeof c->msg, "%s (%s, %s:%d)", c->err.msg, c->call, MS_SRC_FILE, c->line);
        return 1;
    }
    JPEG_CALL(c, jpeg_create_decompress, ci);
    c->created = true;
    JPEG_CALL(c, jpeg_stdio_src, ci, c->f);
    JPEG_CALL(c, jpeg_save_markers, ci, JPEG_APP0 + 1, 0xFFFF);
    JPEG_CALL(c, jpeg_read_header, ci, TRUE);
    if (check_size(c->path, ci->image_width, ci->image_height) != MS_OK) {
        c->st = MS_ERR_FORMAT;
        snprintf(c->msg, sizeof c->msg, "image too large (%ux%u)", ci->image_width, ci->image_height);
        return 1;
    }
    c->orientation = 1;
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1) {
            int o = exif_orientation(m->data, m->data_length);
            if (o != 1) {
                c->orientation = o;
                break;
            }
        }
    }
    if (c->check) {
        bool turned = c->orientation >= 5; /* 5..8 swap width and height */
        int w = (int)(turned ? ci->image_height : ci->image_width);
        int h = (int)(turned ? ci->image_width : ci->image_height);
        if ((c->st = c->check(c->check_user, w, h)) != MS_OK) {
            snprintf(c->msg, sizeof c->msg, "%s", ms_last_error());
            return 1;
        }
    }
    bool cmyk = false;
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        ci->out_color_space = JCS_RGB; /* libjpeg-turbo expands grey itself */
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        ci->out_color_space = JCS_CMYK;
        cmyk = true;
        break;
    default:
        c->st = MS_ERR_FORMAT;
        snprintf(c->msg, sizeof c->msg, "unsupported JPEG colour space (%d components)", ci->num_components);
        return 1;
    }
    JPEG_CALL(c, jpeg_start_decompress, ci);
    c->w = (int)ci->output_width;
    c->h = (int)ci->output_height;
    int comps = ci->output_components;
    if (comps != (cmyk ? 4 : 3)) {
        c->st = MS_ERR_FORMAT;
        snprintf(c->msg, sizeof c->msg, "unexpected JPEG output (%d components)", comps);
        return 1;
    }
    c->rgb = malloc((size_t)c->w * (size_t)c->h * 3);
    c->row = malloc((size_t)c->w * (size_t)comps);
    if (!c->rgb || !c->row) {
        c->st = MS_ERR_OOM;
        snprintf(c->msg, sizeof c->msg, "out of memory for %dx%d pixels", c->w, c->h);
        return 1;
    }
    /* Adobe writes CMYK inverted (255 = no ink); plain CMYK stores ink. */
    bool inverted = ci->saw_Adobe_marker;
    while (ci->output_scanline < ci->output_height) {
        JSAMPROW rp = c->row;
        size_t y = ci->output_scanline;
        if (JPEG_CALL(c, jpeg_read_scanlines, ci, &rp, 1) != 1) {
            c->st = MS_ERR_FORMAT;
            snprintf(c->msg, sizeof c->msg, "invalid JPEG: no data for row %zu", y);
            return 1;
        }
        uint8_t *dst = c->rgb + y * (size_t)c->w * 3;
        if (!cmyk) {
            memcpy(dst, c->row, (size_t)c->w * 3);
            continue;
        }
        for (int x = 0; x < c->w; x++) {
            const uint8_t *p = c->row + 4 * x;
            unsigned k = inverted ? p[3] : 255u - p[3];
            for (int ch = 0; ch < 3; ch++) {
                unsigned v = inverted ? p[ch] : 255u - p[ch];
                dst[3 * x + ch] = (uint8_t)((v * k + 127) / 255);
            }
        }
    }
    JPEG_CALL(c, jpeg_finish_decompress, ci);
    return 0;
}

/* Applies EXIF orientation o to (h, w, 3) src; *w, *h become the new size. */
static uint8_t *orient(const uint8_t *src, int *w, int *h, int o)
{
    int sw = *w, sh = *h;
    bool swap = o >= 5;
    int dw = swap ? sh : sw, dh = swap ? sw : sh;
    uint8_t *dst = malloc((size_t)sw * (size_t)sh * 3);
    if (!dst) return NULL;
    for (int oy = 0; oy < dh; oy++) {
        for (int ox = 0; ox < dw; ox++) {
            int sx, sy;
            switch (o) {
            case 2: sx = sw - 1 - ox, sy = oy; break;                  /* mirror */
            case 3: sx = sw - 1 - ox, sy = sh - 1 - oy; break;         /* 180 */
            case 4: sx = ox, sy = sh - 1 - oy; break;                  /* flip */
            case 5: sx = oy, sy = ox; break;                           /* transpose */
            case 6: sx = oy, sy = sh - 1 - ox; break;                  /* 90 clockwise */
            case 7: sx = sw - 1 - oy, sy = sh - 1 - ox; break;         /* transverse */
            case 8: sx = sw - 1 - oy, sy = ox; break;                  /* 90 anticlockwise */
            default: sx = ox, sy = oy; break;
            }
            memcpy(dst + ((size_t)oy * dw + ox) * 3, src + ((size_t)sy * sw + sx) * 3, 3);
        }
    }
    *w = dw;
    *h = dh;
    return dst;
}

static ms_status jpeg_read_file(ms_image *out, const char *path, FILE *f, image_size_check check,
                                void *user)
{
    jpeg_ctx *c = calloc(1, sizeof *c);
    MS_CHECK_ALLOC(c, sizeof *c);
    c->path = path;
    c->check = check;
    c->check_user = user;
    c->f = f;
    c->call = "libjpeg";
    c->st = MS_OK;
    int failed = jpeg_decode(c);
    if (c->created) jpeg_destroy_decompress(&c->cinfo);
    free(c->row);
    ms_status st = MS_OK;
    if (failed) {
        free(c->rgb);
        st = c->st != MS_OK ? ms_error(c->st, "%s: %s", path, c->msg)
                            : ms_error(MS_ERR_FORMAT, "%s: invalid JPEG: %s", path, c->msg);
        free(c);
        return st;
    }
    out->w = c->w;
    out->h = c->h;
    out->rgb = c->rgb;
    if (c->orientation != 1) {
        uint8_t *r = orient(c->rgb, &out->w, &out->h, c->orientation);
        free(c->rgb);
        out->rgb = r;
        if (!r) st = ms_error(MS_ERR_OOM, "%s: out of memory rotating %dx%d pixels", path, c->w, c->h);
    }
    free(c);
    return st;
}

/* ------------------------------------------------------------- readers */

static ms_status open_image(FILE **f, uint8_t sig[8], size_t *n, const char *path)
{
    MS_TRY(fio_fopen_input(f, path)); /* a FIFO is refused, not waited on */
    *n = fread(sig, 1, 8, *f);
    if (ferror(*f)) {
        int err = errno;
        fclose(*f);
        return ms_error(MS_ERR_IO, "%s: read error: %s", path, strerror(err));
    }
    rewind(*f);
    return MS_OK;
}

ms_status image_read(ms_image *out, const char *path) { return image_read_checked(out, path, NULL, NULL); }

ms_status image_read_checked(ms_image *out, const char *path, image_size_check check, void *user)
{
    memset(out, 0, sizeof *out);
    FILE *f;
    uint8_t sig[8];
    size_t n = 0;
    MS_TRY(open_image(&f, sig, &n, path));
    ms_status st;
    if (n == 8 && png_sig_cmp(sig, 0, 8) == 0) {
        png_ctx c = {.path = path, .check = check, .check_user = user};
        st = png_read_file(&c, f);
        if (st == MS_OK) {
            out->w = (int)c.w;
            out->h = (int)c.h;
            out->rgb = c.buf;
            if (c.channels == 4) {
                /* Drop alpha in place: the write cursor never passes the read one. */
                size_t np = (size_t)c.w * c.h;
                for (size_t i = 0; i < np; i++) memmove(c.buf + 3 * i, c.buf + 4 * i, 3);
                uint8_t *shrunk = realloc(c.buf, np * 3);
                if (shrunk) out->rgb = shrunk;
            }
        }
    } else if (n >= 3 && sig[0] == 0xFF && sig[1] == 0xD8 && sig[2] == 0xFF) {
        st = jpeg_read_file(out, path, f, check, user);
    } else if (n == 0) {
        st = ms_error(MS_ERR_FORMAT, "%s: empty file, not a PNG or JPEG file", path);
    } else {
        st = ms_error(MS_ERR_FORMAT, "%s: not a PNG or JPEG file", path);
    }
    fclose(f);
    if (st != MS_OK) memset(out, 0, sizeof *out);
    return st;
}

void image_free(ms_image *img)
{
    if (!img) return;
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

ms_status image_read_label(uint8_t **out, int *w, int *h, const char *path)
{
    *out = NULL;
    *w = *h = 0;
    FILE *f;
    uint8_t sig[8];
    size_t n = 0;
    MS_TRY(open_image(&f, sig, &n, path));
    if (n != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fclose(f);
        return ms_error(MS_ERR_FORMAT, "%s: label image must be a PNG file", path);
    }
    png_ctx c = {.path = path, .label = true};
    ms_status st = png_read_file(&c, f);
    fclose(f);
    if (st != MS_OK) return st;
    *out = c.buf;
    *w = (int)c.w;
    *h = (int)c.h;
    return MS_OK;
}

/* ------------------------------------------------------------- writers */

typedef struct {
    const char *path;
    const char *tmp;
    FILE *f;
    png_structp png;
    png_infop info;
    char msg[256];
    const char *call;
    int line;
    int color_type;
    const uint8_t *px;
    int w, h, channels;
    const uint8_t (*palette)[3];
    int n_palette;
} png_wctx;

static void png_on_write_error(png_structp png, png_const_charp msg)
{
    png_wctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static int png_encode(png_wctx *c)
{
    if (setjmp(png_jmpbuf(c->png))) return 1;
    PNG_CALL(c, png_init_io, c->png, c->f);
    PNG_CALL(c, png_set_IHDR, c->png, c->info, (png_uint_32)c->w, (png_uint_32)c->h, 8, c->color_type,
             PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (c->color_type == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[256];
        for (int i = 0; i < c->n_palette; i++) {
            pal[i].red = c->palette[i][0];
            pal[i].green = c->palette[i][1];
            pal[i].blue = c->palette[i][2];
        }
        PNG_CALL(c, png_set_PLTE, c->png, c->info, pal, c->n_palette);
    }
    PNG_CALL(c, png_write_info, c->png, c->info);
    size_t stride = (size_t)c->w * (size_t)c->channels;
    for (int y = 0; y < c->h; y++)
        PNG_CALL(c, png_write_row, c->png, (png_const_bytep)(c->px + (size_t)y * stride));
    PNG_CALL(c, png_write_end, c->png, c->info);
    return 0;
}

/* Writers accept what the readers accept, so every file written reads back. */
static ms_status check_write_args(const char *path, const uint8_t *px, int w, int h)
{
    if (!px || w <= 0 || h <= 0 || w > MS_IMG_MAX_SIDE || h > MS_IMG_MAX_SIDE ||
        (uint64_t)w * (uint64_t)h > MS_IMG_MAX_PIXELS)
        return ms_error(MS_ERR_ARG, "%s: cannot write a %dx%d image", path, w, h);
    return MS_OK;
}

static ms_status png_write_file(const char *path, const uint8_t *px, int w, int h, int color_type, int channels,
                                const uint8_t (*palette)[3], int n_palette)
{
    MS_TRY(check_write_args(path, px, w, h));
    fio_atomic af;
    MS_TRY(fio_atomic_begin(&af, path));
    png_wctx c = {.path = path, .tmp = af.tmp, .f = af.f, .color_type = color_type, .px = px, .w = w,
                  .h = h, .channels = channels, .palette = palette, .n_palette = n_palette,
                  .call = "libpng"};
    c.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &c, png_on_write_error, png_on_warning);
    if (c.png) c.info = png_create_info_struct(c.png);
    ms_status st = MS_OK;
    if (!c.png || !c.info) {
        st = ms_error(MS_ERR_OOM, "%s: out of memory creating the PNG writer (%s:%d)", path, MS_SRC_FILE, __LINE__);
    } else if (png_encode(&c)) {
        st = ms_error(MS_ERR_IO, "%s: PNG write failed: %s (%s, %s:%d)", path, c.msg, c.call, MS_SRC_FILE, c.line);
    }
    png_destroy_write_struct(c.png ? &c.png : NULL, c.info ? &c.info : NULL);
    /* fsync before the rename (in the commit) so a power loss never leaves a
     * truncated file under the final name, which --skip-existing would trust. */
    if (st != MS_OK) {
        fio_atomic_abort(&af);
        return st;
    }
    return fio_atomic_commit(&af);
}

ms_status image_write_indexed(const char *path, const uint8_t *idx, int w, int h, const uint8_t (*palette)[3],
                              int n_palette)
{
    if (!palette || n_palette < 1 || n_palette > 256)
        return ms_error(MS_ERR_ARG, "%s: palette of %d entries (need 1..256)", path, n_palette);
    MS_TRY(check_write_args(path, idx, w, h));
    /* An index past the palette makes a PNG that readers reject or show
     * arbitrarily, so refuse to write one. */
    size_t np = (size_t)w * (size_t)h;
    for (size_t i = 0; i < np; i++)
        if (idx[i] >= n_palette)
            return ms_error(MS_ERR_ARG, "%s: index %d at (%zu, %zu) is outside the %d-entry palette", path, idx[i],
                            i % (size_t)w, i / (size_t)w, n_palette);
    return png_write_file(path, idx, w, h, PNG_COLOR_TYPE_PALETTE, 1, palette, n_palette);
}

ms_status image_write_gray(const char *path, const uint8_t *px, int w, int h)
{
    return png_write_file(path, px, w, h, PNG_COLOR_TYPE_GRAY, 1, NULL, 0);
}

ms_status image_write_rgb(const char *path, const uint8_t *px, int w, int h)
{
    return png_write_file(path, px, w, h, PNG_COLOR_TYPE_RGB, 3, NULL, 0);
}

ms_status image_write_rgba(const char *path, const uint8_t *px, int w, int h)
{
    return png_write_file(path, px, w, h, PNG_COLOR_TYPE_RGB_ALPHA, 4, NULL, 0);
}
