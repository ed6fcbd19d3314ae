/* Image files: every PNG colour type and bit depth (written here with
 * libpng, so the expected pixels are known exactly), JPEG rgb/grey/CMYK and
 * all eight EXIF orientations (written with libjpeg), corrupt and hostile
 * files, label reading, and the atomic PNG writers. */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>

#include "app/file_io.h"
#include "app/image_io.h"
#include "testutil.h"

static void setup(void) { test_dir_create("image_io"); }
static void teardown(void) { test_dir_remove(); }
#define at test_path
#define dir test_dir
#define assert_error assert_error_names

/* Entries in dir whose name contains ".tmp-" (left-over temp files). */
static int count_temps(void)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (fio_is_temp_name(e->d_name) || strstr(e->d_name, ".tmp")) n++;
    closedir(d);
    return n;
}

/* ----------------------------------------------------- PNG generation */

#define W 13 /* odd sizes: partial bytes at low depths, ragged Adam7 passes */
#define H 11

/* The stored sample for pixel (x, y), channel ch at bit depth bd. 16-bit
 * samples are k*257 + r with k <= 254 and r <= 100 (so no overflow), and
 * scaling to 8 bits (round(v/257)) gives exactly k. */
static unsigned sample(int x, int y, int ch, int bd)
{
    unsigned k = (unsigned)(x * 37 + y * 101 + ch * 59 + 11);
    if (bd == 16) return (k % 255) * 257 + (unsigned)((x * 3 + y * 7 + ch) % 101);
    return k % (1u << bd);
}

static unsigned to8(unsigned v, int bd)
{
    switch (bd) {
    case 1: return v * 255;
    case 2: return v * 85;
    case 4: return v * 17;
    case 16: return v / 257;
    default: return v;
    }
}

static void pal_color(uint8_t rgb[3], int i)
{
    rgb[0] = (uint8_t)(i * 3 + 1);
    rgb[1] = (uint8_t)(255 - i);
    rgb[2] = (uint8_t)(i * 7 + 5);
}

typedef struct {
    int ct, bd;
    bool interlace, trns;
} png_kind;

static int channels_of(int ct)
{
    switch (ct) {
    case PNG_COLOR_TYPE_GRAY:
    case PNG_COLOR_TYPE_PALETTE: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    default: return 4;
    }
}

/* Writes a W x H PNG of kind k with samples from sample(). */
static void make_png(const char *path, png_kind k)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    ck_assert(png && info);
    if (setjmp(png_jmpbuf(png))) ck_abort_msg("libpng failed writing the test image");
    png_init_io(png, f);
    png_set_IHDR(png, info, W, H, k.bd, k.ct, k.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (k.ct == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[256];
        int n = 1 << k.bd;
        for (int i = 0; i < n; i++) {
            uint8_t c[3];
            pal_color(c, i);
            pal[i] = (png_color){c[0], c[1], c[2]};
        }
        png_set_PLTE(png, info, pal, n);
        if (k.trns) {
            png_byte alpha[256];
            for (int i = 0; i < n; i++) alpha[i] = (png_byte)(i * 13);
            png_set_tRNS(png, info, alpha, n, NULL);
        }
    } else if (k.trns) {
        png_color_16 tc = {.gray = (png_uint_16)sample(0, 0, 0, k.bd), .red = (png_uint_16)sample(0, 0, 0, k.bd),
                           .green = (png_uint_16)sample(0, 0, 1, k.bd), .blue = (png_uint_16)sample(0, 0, 2, k.bd)};
        png_set_tRNS(png, info, NULL, 0, &tc);
    }
    png_write_info(png, info);
    if (k.interlace) png_set_interlace_handling(png);
    int ch = channels_of(k.ct);
    size_t rowbytes = ((size_t)W * ch * k.bd + 7) / 8;
    uint8_t *img = calloc(H, rowbytes);
    png_bytep rows[H];
    for (int y = 0; y < H; y++) {
        uint8_t *r = img + y * rowbytes;
        rows[y] = r;
        for (int x = 0; x < W; x++) {
            for (int c = 0; c < ch; c++) {
                unsigned v = sample(x, y, c, k.bd);
                size_t bit = ((size_t)x * ch + c) * k.bd;
                if (k.bd == 16) {
                    r[bit / 8] = (uint8_t)(v >> 8); /* PNG is big-endian */
                    r[bit / 8 + 1] = (uint8_t)v;
                } else {
                    /* Sub-byte samples are packed from the high bits down. */
                    r[bit / 8] |= (uint8_t)(v << (8 - k.bd - bit % 8));
                }
            }
        }
    }
    png_write_image(png, rows);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(img);
    ck_assert_int_eq(fclose(f), 0);
}

/* The RGB image_read must return for kind k. */
static void expected_rgb(uint8_t *out, png_kind k, int x, int y)
{
    switch (k.ct) {
    case PNG_COLOR_TYPE_PALETTE:
        pal_color(out, (int)sample(x, y, 0, k.bd));
        break;
    case PNG_COLOR_TYPE_GRAY:
    case PNG_COLOR_TYPE_GRAY_ALPHA:
        out[0] = out[1] = out[2] = (uint8_t)to8(sample(x, y, 0, k.bd), k.bd);
        break;
    default:
        for (int c = 0; c < 3; c++) out[c] = (uint8_t)to8(sample(x, y, c, k.bd), k.bd);
    }
}

static const png_kind all_kinds[] = {
    {PNG_COLOR_TYPE_GRAY, 1},          {PNG_COLOR_TYPE_GRAY, 2},          {PNG_COLOR_TYPE_GRAY, 4},
    {PNG_COLOR_TYPE_GRAY, 8},          {PNG_COLOR_TYPE_GRAY, 16},         {PNG_COLOR_TYPE_GRAY, 8, false, true},
    {PNG_COLOR_TYPE_GRAY, 2, true, true},
    {PNG_COLOR_TYPE_GRAY_ALPHA, 8},    {PNG_COLOR_TYPE_GRAY_ALPHA, 16},   {PNG_COLOR_TYPE_RGB, 8},
    {PNG_COLOR_TYPE_RGB, 16},          {PNG_COLOR_TYPE_RGB, 8, false, true}, {PNG_COLOR_TYPE_RGB, 16, true, true},
    {PNG_COLOR_TYPE_RGB_ALPHA, 8},     {PNG_COLOR_TYPE_RGB_ALPHA, 16},    {PNG_COLOR_TYPE_PALETTE, 1},
    {PNG_COLOR_TYPE_PALETTE, 2},       {PNG_COLOR_TYPE_PALETTE, 4},       {PNG_COLOR_TYPE_PALETTE, 8},
    {PNG_COLOR_TYPE_PALETTE, 4, false, true}, {PNG_COLOR_TYPE_PALETTE, 8, false, true},
    {PNG_COLOR_TYPE_PALETTE, 8, true, true},  {PNG_COLOR_TYPE_RGB, 8, true},  {PNG_COLOR_TYPE_GRAY, 1, true},
    {PNG_COLOR_TYPE_RGB_ALPHA, 16, true},     {PNG_COLOR_TYPE_GRAY_ALPHA, 8, true},
};

START_TEST(test_png_all_kinds)
{
    for (size_t i = 0; i < sizeof all_kinds / sizeof *all_kinds; i++) {
        png_kind k = all_kinds[i];
        const char *p = at("kind.png");
        make_png(p, k);
        ms_image img;
        ck_assert_msg(image_read(&img, p) == MS_OK, "kind %zu (ct %d bd %d): %s", i, k.ct, k.bd, ms_last_error());
        ck_assert_int_eq(img.w, W);
        ck_assert_int_eq(img.h, H);
        for (int y = 0; y < H; y++) {
            for (int x = 0; x < W; x++) {
                uint8_t want[3];
                expected_rgb(want, k, x, y);
                const uint8_t *got = img.rgb + (y * W + x) * 3;
                ck_assert_msg(memcmp(got, want, 3) == 0,
                              "kind %zu (ct %d bd %d il %d trns %d) at (%d,%d): got %d,%d,%d want %d,%d,%d", i, k.ct,
                              k.bd, k.interlace, k.trns, x, y, got[0], got[1], got[2], want[0], want[1], want[2]);
            }
        }
        image_free(&img);
        ck_assert_ptr_null(img.rgb);
    }
}
END_TEST

START_TEST(test_label_read)
{
    const char *p = at("label.png");
    /* Palette and grey at 8 bits and below: raw indices, never colours. */
    const png_kind ok[] = {{PNG_COLOR_TYPE_PALETTE, 8}, {PNG_COLOR_TYPE_PALETTE, 4, false, true},
                           {PNG_COLOR_TYPE_PALETTE, 1}, {PNG_COLOR_TYPE_GRAY, 8},
                           {PNG_COLOR_TYPE_GRAY, 2, true}, {PNG_COLOR_TYPE_PALETTE, 8, true}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        make_png(p, ok[i]);
        uint8_t *lab;
        int w, h;
        ck_assert_msg(image_read_label(&lab, &w, &h, p) == MS_OK, "%s", ms_last_error());
        ck_assert_int_eq(w, W);
        ck_assert_int_eq(h, H);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                ck_assert_msg(lab[y * W + x] == sample(x, y, 0, ok[i].bd), "case %zu (%d,%d): %d", i, x, y,
                              lab[y * W + x]);
        free(lab);
    }
    const png_kind bad[] = {{PNG_COLOR_TYPE_RGB, 8}, {PNG_COLOR_TYPE_GRAY, 16}, {PNG_COLOR_TYPE_GRAY_ALPHA, 8},
                            {PNG_COLOR_TYPE_RGB_ALPHA, 8}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        make_png(p, bad[i]);
        uint8_t *lab = (uint8_t *)1;
        int w, h;
        ck_assert_int_eq(image_read_label(&lab, &w, &h, p), MS_ERR_FORMAT);
        ck_assert_ptr_null(lab);
        assert_error(p, "label image must be grey or palette (at most 8-bit), got");
    }
    uint8_t *lab;
    int w, h;
    write_bytes(p, "\xFF\xD8\xFF\xE0", 4);
    ck_assert_int_eq(image_read_label(&lab, &w, &h, p), MS_ERR_FORMAT);
    assert_error(p, "must be a PNG");
    ck_assert_int_eq(image_read_label(&lab, &w, &h, at("none.png")), MS_ERR_IO);
    assert_error(at("none.png"), "cannot open");
}
END_TEST

/* ------------------------------------------------------ PNG corruption */

static uint32_t crc32_png(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return c ^ 0xFFFFFFFFu;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Rewrites IHDR's width and height and fixes its CRC, so only our size
 * check can object. IHDR always starts at byte 8: length, "IHDR", data. */
static void patch_ihdr(const char *path, uint32_t w, uint32_t h)
{
    size_t n;
    uint8_t *b = read_bytes(path, &n);
    ck_assert_int_eq(memcmp(b + 12, "IHDR", 4), 0);
    put_be32(b + 16, w);
    put_be32(b + 20, h);
    put_be32(b + 29, crc32_png(b + 12, 17));
    write_bytes(path, b, n);
    free(b);
}

START_TEST(test_png_corrupt)
{
    const char *src = at("good.png"), *p = at("bad.png");
    make_png(src, (png_kind){PNG_COLOR_TYPE_RGB, 8});
    size_t n;
    uint8_t *b = read_bytes(src, &n);
    ms_image img;

    /* Truncated anywhere, including just before IEND, is an error. */
    const size_t cuts[] = {5, 8, 12, 20, 33, 40, n / 2, n - 13, n - 12, n - 4, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(p, b, cuts[i]);
        ck_assert_msg(image_read(&img, p) != MS_OK, "cut at %zu of %zu accepted", cuts[i], n);
        assert_error(p, NULL);
        ck_assert_ptr_null(img.rgb);
    }
    write_bytes(p, b, n - 12);
    ck_assert_int_ne(image_read(&img, p), MS_OK);
    assert_error(p, "file truncated");

    /* A flipped bit inside IHDR's data or the image data: CRC mismatch. */
    b[17] ^= 0x01;
    write_bytes(p, b, n);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "CRC");
    b[17] ^= 0x01;
    b[33 + 8 + 3] ^= 0x40; /* inside the first IDAT's data */
    write_bytes(p, b, n);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "invalid PNG");
    b[33 + 8 + 3] ^= 0x40;

    /* Absurd sizes, with a correct CRC, refused before allocating. */
    write_bytes(p, b, n);
    patch_ihdr(p, 60000, 60000);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "image too large (60000x60000)");
    patch_ihdr(p, 70000, 10);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "image too large (70000x10)");
    patch_ihdr(p, 0, 10);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "invalid PNG");
    /* Sane but larger than the data: runs out of image data. */
    patch_ihdr(p, 64, 64);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "invalid PNG");
    free(b);

    /* Random bytes, with and without a valid signature in front. */
    uint8_t rnd[1024];
    float r[1024];
    rand_fill(r, 1024, 7, 0, 256);
    for (int i = 0; i < 1024; i++) rnd[i] = (uint8_t)r[i];
    write_bytes(p, rnd, sizeof rnd);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "not a PNG or JPEG file");
    memcpy(rnd, "\x89PNG\r\n\x1a\n", 8);
    write_bytes(p, rnd, sizeof rnd);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "invalid PNG");
    memcpy(rnd, "\xFF\xD8\xFF", 3);
    write_bytes(p, rnd, sizeof rnd);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "invalid JPEG");

    write_bytes(p, "", 0);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "empty file");
    ck_assert_int_eq(image_read(&img, at("missing.png")), MS_ERR_IO);
    assert_error(at("missing.png"), "cannot open");
    ck_assert_int_eq(image_read(&img, dir), MS_ERR_IO);
    assert_error(dir, NULL);
}
END_TEST

/* ---------------------------------------------------------------- JPEG */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} test_jerr;

static void test_jpeg_error(j_common_ptr ci) { longjmp(((test_jerr *)ci->err)->jb, 1); }

/* Writes (h, w, comps) pixels at quality 100, no chroma subsampling, with an
 * optional APP1 block. */
static void make_jpeg(const char *path, const uint8_t *px, int w, int h, int comps, J_COLOR_SPACE cs,
                      const uint8_t *app1, unsigned app1_len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    struct jpeg_compress_struct ci;
    test_jerr err;
    ci.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = test_jpeg_error;
    if (setjmp(err.jb)) ck_abort_msg("libjpeg failed writing the test image");
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = comps;
    ci.in_color_space = cs;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 100, TRUE);
    for (int i = 0; i < ci.num_components; i++) ci.comp_info[i].h_samp_factor = ci.comp_info[i].v_samp_factor = 1;
    jpeg_start_compress(&ci, TRUE);
    if (app1) jpeg_write_marker(&ci, JPEG_APP0 + 1, app1, app1_len);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * w * comps);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    ck_assert_int_eq(fclose(f), 0);
}

/* 16x16 flat blocks, cols x rows of them, colour from blk_color. Flat 8x8
 * blocks carry only a DC term, so at quality 100 (all quantisers 1) the
 * error is the RGB->YCbCr->RGB rounding (half a level each way) plus DC
 * rounding: 1 level observed with libjpeg-turbo 2.1; 2 leaves room for other
 * DCT/colour-conversion code paths (SIMD vs C), while a wrong colour space or
 * channel order is off by tens. */
#define BLK 16
#define JPEG_TOL 2

static void blk_color(uint8_t c[3], int r, int col)
{
    static const uint8_t pal[6][3] = {{200, 30, 40}, {20, 180, 90}, {40, 60, 220},
                                      {240, 240, 30}, {10, 10, 10}, {128, 200, 250}};
    memcpy(c, pal[(r * 3 + col) % 6], 3);
}

static uint8_t *block_image(int rows, int cols)
{
    uint8_t *px = malloc((size_t)rows * BLK * cols * BLK * 3);
    for (int y = 0; y < rows * BLK; y++)
        for (int x = 0; x < cols * BLK; x++) blk_color(px + ((size_t)y * cols * BLK + x) * 3, y / BLK, x / BLK);
    return px;
}

static void assert_near(const uint8_t *got, const uint8_t *want, int tol, const char *what)
{
    for (int c = 0; c < 3; c++)
        ck_assert_msg(abs(got[c] - want[c]) <= tol, "%s: got %d,%d,%d want %d,%d,%d", what, got[0], got[1], got[2],
                      want[0], want[1], want[2]);
}

START_TEST(test_jpeg_rgb_grey_cmyk)
{
    const char *p = at("a.jpg");
    uint8_t *px = block_image(2, 3);
    make_jpeg(p, px, 3 * BLK, 2 * BLK, 3, JCS_RGB, NULL, 0);
    ms_image img;
    ck_assert_msg(image_read(&img, p) == MS_OK, "%s", ms_last_error());
    ck_assert_int_eq(img.w, 3 * BLK);
    ck_assert_int_eq(img.h, 2 * BLK);
    /* Every pixel, not only block centres: edges of flat blocks are exact
     * too, since the blocks align with the 8x8 DCT grid. */
    for (int i = 0; i < img.w * img.h; i++) assert_near(img.rgb + 3 * i, px + 3 * i, JPEG_TOL, "rgb");
    image_free(&img);
    free(px);

    uint8_t grey[16 * 24];
    for (int i = 0; i < 16 * 24; i++) grey[i] = (uint8_t)((i % 24) / 8 * 100 + 20); /* 20, 120, 220 columns */
    make_jpeg(p, grey, 24, 16, 1, JCS_GRAYSCALE, NULL, 0);
    ck_assert_msg(image_read(&img, p) == MS_OK, "%s", ms_last_error());
    ck_assert_int_eq(img.w, 24);
    ck_assert_int_eq(img.h, 16);
    /* Grey has no colour conversion: only DCT rounding (1 level). */
    for (int i = 0; i < 16 * 24; i++) {
        uint8_t want[3] = {grey[i], grey[i], grey[i]};
        assert_near(img.rgb + 3 * i, want, 1, "grey");
    }
    image_free(&img);

    /* CMYK as Adobe writes it (inverted: 255 = no ink), stored by libjpeg as
     * YCCK with an Adobe marker. Raw (255, 0, 255, 255) is pure magenta ink
     * only; raw (128, 255, 255, 200) is R = 128*200/255, G = B = 200. */
    uint8_t cmyk[16 * 16 * 4];
    for (int i = 0; i < 256; i++) {
        static const uint8_t a[4] = {255, 0, 255, 255}, b2[4] = {128, 255, 255, 200};
        memcpy(cmyk + 4 * i, (i % 16) < 8 ? a : b2, 4);
    }
    make_jpeg(p, cmyk, 16, 16, 4, JCS_CMYK, NULL, 0);
    ck_assert_msg(image_read(&img, p) == MS_OK, "%s", ms_last_error());
    /* YCCK has the same conversion rounding as YCbCr, and multiplying by
     * K/255 <= 1 does not grow it. */
    assert_near(img.rgb + (4 * 16 + 3) * 3, (const uint8_t[]){255, 0, 255}, JPEG_TOL, "cmyk magenta");
    assert_near(img.rgb + (4 * 16 + 12) * 3, (const uint8_t[]){100, 200, 200}, JPEG_TOL, "cmyk mixed");
    image_free(&img);
}
END_TEST

/* An Exif APP1 payload holding only IFD0 with Orientation = o. */
static unsigned exif_block(uint8_t *b, int o, bool big_endian)
{
    memcpy(b, "Exif\0\0", 6);
    uint8_t *t = b + 6;
    const uint8_t le[] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, (uint8_t)o, 0, 0, 0,
                          0, 0, 0, 0};
    const uint8_t be[] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, (uint8_t)o, 0, 0,
                          0, 0, 0, 0};
    memcpy(t, big_endian ? be : le, sizeof le);
    return 6 + (unsigned)sizeof le;
}

START_TEST(test_jpeg_exif_orientation)
{
    /* EXIF 2.3 table: where the stored row 0 and column 0 are shown. */
    static const struct {
        char row0, col0; /* 't'op, 'b'ottom, 'l'eft, 'r'ight */
    } spec[9] = {{0}, {'t', 'l'}, {'t', 'r'}, {'b', 'r'}, {'b', 'l'}, {'l', 't'}, {'r', 't'}, {'r', 'b'}, {'l', 'b'}};
    const int R = 2, C = 3; /* stored grid of flat blocks */
    uint8_t *px = block_image(R, C);
    const char *p = at("o.jpg");
    for (int o = 1; o <= 8; o++) {
        uint8_t app1[64];
        unsigned len = exif_block(app1, o, o % 2 == 0);
        make_jpeg(p, px, C * BLK, R * BLK, 3, JCS_RGB, app1, len);
        ms_image img;
        ck_assert_msg(image_read(&img, p) == MS_OK, "%s", ms_last_error());
        bool rows_vertical = spec[o].row0 == 't' || spec[o].row0 == 'b';
        ck_assert_int_eq(img.w, (rows_vertical ? C : R) * BLK);
        ck_assert_int_eq(img.h, (rows_vertical ? R : C) * BLK);
        for (int r = 0; r < R; r++) {
            for (int c = 0; c < C; c++) {
                int bx, by;
                if (rows_vertical) {
                    by = spec[o].row0 == 't' ? r : R - 1 - r;
                    bx = spec[o].col0 == 'l' ? c : C - 1 - c;
                } else {
                    bx = spec[o].row0 == 'l' ? r : R - 1 - r;
                    by = spec[o].col0 == 't' ? c : C - 1 - c;
                }
                uint8_t want[3];
                blk_color(want, r, c);
                char what[64];
                snprintf(what, sizeof what, "orientation %d block (%d,%d)", o, r, c);
                /* block centre */
                assert_near(img.rgb + ((size_t)(by * BLK + BLK / 2) * img.w + bx * BLK + BLK / 2) * 3, want, JPEG_TOL,
                            what);
            }
        }
        image_free(&img);
    }
    /* A malformed Exif block is ignored, not fatal. */
    uint8_t app1[64];
    unsigned len = exif_block(app1, 6, false);
    app1[6 + 4] = 200; /* IFD0 offset past the block */
    make_jpeg(p, px, C * BLK, R * BLK, 3, JCS_RGB, app1, len);
    ms_image img;
    ck_assert_int_eq(image_read(&img, p), MS_OK);
    ck_assert_int_eq(img.w, C * BLK);
    image_free(&img);
    free(px);
}
END_TEST

START_TEST(test_jpeg_corrupt)
{
    const char *src = at("good.jpg"), *p = at("bad.jpg");
    uint8_t *px = block_image(2, 3);
    make_jpeg(src, px, 3 * BLK, 2 * BLK, 3, JCS_RGB, NULL, 0);
    free(px);
    size_t n;
    uint8_t *b = read_bytes(src, &n);
    ms_image img;
    const size_t cuts[] = {3, 4, 20, 100, 300, n / 2, n - 10, n - 2};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(p, b, cuts[i]);
        ck_assert_msg(image_read(&img, p) == MS_ERR_FORMAT, "cut at %zu of %zu accepted", cuts[i], n);
        assert_error(p, "invalid JPEG");
        ck_assert_ptr_null(img.rgb);
    }
    write_bytes(p, b, n / 2);
    image_read(&img, p);
    assert_error(p, "Premature end of JPEG file");

    /* Absurd size in the frame header (SOF0 = FF C0: len, precision, h, w). */
    size_t sof = 0;
    for (size_t i = 2; i + 9 < n; i++)
        if (b[i] == 0xFF && b[i + 1] == 0xC0) {
            sof = i;
            break;
        }
    ck_assert_uint_gt(sof, 0);
    b[sof + 5] = 0xFD, b[sof + 6] = 0xE8; /* height 65000 */
    b[sof + 7] = 0xFD, b[sof + 8] = 0xE8; /* width 65000 */
    write_bytes(p, b, n);
    ck_assert_int_eq(image_read(&img, p), MS_ERR_FORMAT);
    assert_error(p, "image too large (65000x65000)");
    free(b);
}
END_TEST

/* -------------------------------------------------------------- writers */

START_TEST(test_writers_roundtrip)
{
    const int w = 7, h = 5;
    uint8_t idx[35], rgb[35 * 3], rgba[35 * 4];
    const uint8_t pal[3][3] = {{0, 0, 0}, {255, 0, 0}, {10, 20, 30}};
    for (int i = 0; i < w * h; i++) {
        idx[i] = (uint8_t)(i % 3);
        for (int c = 0; c < 4; c++) rgba[4 * i + c] = (uint8_t)(i * 7 + c * 60);
        for (int c = 0; c < 3; c++) rgb[3 * i + c] = (uint8_t)(i * 5 + c * 80);
    }
    uint8_t *lab;
    int lw, lh;
    ms_image img;

    const char *p = at("idx.png");
    ck_assert_int_eq(image_write_indexed(p, idx, w, h, pal, 3), MS_OK);
    ck_assert_int_eq(image_read_label(&lab, &lw, &lh, p), MS_OK);
    ck_assert_int_eq(lw, w);
    ck_assert_int_eq(lh, h);
    ck_assert_int_eq(memcmp(lab, idx, sizeof idx), 0);
    free(lab);
    ck_assert_int_eq(image_read(&img, p), MS_OK);
    for (int i = 0; i < w * h; i++) ck_assert_int_eq(memcmp(img.rgb + 3 * i, pal[idx[i]], 3), 0);
    image_free(&img);
    /* The PLTE chunk holds exactly n_palette entries. */
    size_t n;
    uint8_t *b = read_bytes(p, &n);
    uint8_t *plte = memmem(b, n, "PLTE", 4);
    ck_assert_ptr_nonnull(plte);
    ck_assert_int_eq((plte[-4] << 24 | plte[-3] << 16 | plte[-2] << 8 | plte[-1]), 9);
    free(b);

    p = at("grey.png");
    ck_assert_int_eq(image_write_gray(p, rgb, w, h), MS_OK);
    ck_assert_int_eq(image_read_label(&lab, &lw, &lh, p), MS_OK);
    ck_assert_int_eq(memcmp(lab, rgb, 35), 0);
    free(lab);

    p = at("rgb.png");
    ck_assert_int_eq(image_write_rgb(p, rgb, w, h), MS_OK);
    ck_assert_int_eq(image_read(&img, p), MS_OK);
    ck_assert_int_eq(memcmp(img.rgb, rgb, sizeof rgb), 0);
    image_free(&img);

    p = at("rgba.png");
    ck_assert_int_eq(image_write_rgba(p, rgba, w, h), MS_OK);
    ck_assert_int_eq(image_read(&img, p), MS_OK);
    for (int i = 0; i < w * h; i++) ck_assert_int_eq(memcmp(img.rgb + 3 * i, rgba + 4 * i, 3), 0);
    image_free(&img);

    /* Overwriting replaces the file. */
    ck_assert_int_eq(image_write_rgb(at("rgb.png"), rgba, w, h), MS_OK);
    ck_assert_int_eq(image_read(&img, at("rgb.png")), MS_OK);
    ck_assert_int_eq(memcmp(img.rgb, rgba, sizeof rgb), 0);
    image_free(&img);

    ck_assert_int_eq(count_temps(), 0);
}
END_TEST

START_TEST(test_writers_errors)
{
    uint8_t px[12] = {0};
    const uint8_t pal[2][3] = {{0, 0, 0}, {1, 1, 1}};
    char p[600];
    snprintf(p, sizeof p, "%s/nodir/out.png", dir);
    ck_assert_int_eq(image_write_rgb(p, px, 2, 2), MS_ERR_IO);
    assert_error(p, "cannot create");
    ck_assert_int_eq(image_write_indexed(p, px, 2, 2, pal, 2), MS_ERR_IO);
    assert_error(p, NULL);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/nodir", dir);
    ck_assert_int_ne(access(sub, F_OK), 0);

    const char *q = at("x.png");
    px[3] = 2; /* outside a 2-entry palette */
    ck_assert_int_eq(image_write_indexed(q, px, 2, 2, pal, 2), MS_ERR_ARG);
    assert_error(q, "index 2 at (1, 1)");
    ck_assert_int_eq(image_write_indexed(q, px, 2, 2, pal, 0), MS_ERR_ARG);
    ck_assert_int_eq(image_write_gray(q, px, 0, 2), MS_ERR_ARG);
    ck_assert_int_eq(image_write_gray(q, px, 70000, 1), MS_ERR_ARG);
    ck_assert_int_ne(access(q, F_OK), 0);

    /* The destination is a directory: refused before anything is written. */
    const char *d = at("adir.png");
    ck_assert_int_eq(mkdir(d, 0755), 0);
    ck_assert_int_eq(image_write_gray(d, px, 2, 2), MS_ERR_IO);
    assert_error(d, "is a folder");
    ck_assert_int_eq(count_temps(), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("image_io");
    TCase *tc = tcase_create("image_io");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_png_all_kinds);
    tcase_add_test(tc, test_label_read);
    tcase_add_test(tc, test_png_corrupt);
    tcase_add_test(tc, test_jpeg_rgb_grey_cmyk);
    tcase_add_test(tc, test_jpeg_exif_orientation);
    tcase_add_test(tc, test_jpeg_corrupt);
    tcase_add_test(tc, test_writers_roundtrip);
    tcase_add_test(tc, test_writers_errors);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
