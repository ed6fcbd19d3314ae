/* Image files: PNG (libpng) and JPEG (libjpeg-turbo) in, PNG out. Every
 * colour type and bit depth is converted to 8-bit RGB; writes are atomic. */
#ifndef MS_IMAGE_IO_H
#define MS_IMAGE_IO_H

#include "kernels/common.h"

typedef struct {
    int w, h;
    uint8_t *rgb;   /* (h, w, 3), owned */
} ms_image;

/* Detects the format from the bytes. Errors name the file and the problem. */
ms_status image_read(ms_image *out, const char *path);
/* image_read that calls check(user, w, h) with the image's size (after EXIF
 * rotation) once the header is read and before any pixel buffer is
 * allocated; an error from it ends the read ("path: " + its message). */
typedef ms_status (*image_size_check)(void *user, int w, int h);
ms_status image_read_checked(ms_image *out, const char *path, image_size_check check, void *user);
void image_free(ms_image *img);

/* A label image as raw 8-bit values (grey or palette indices, no conversion). */
ms_status image_read_label(uint8_t **out /* (h, w) */, int *w, int *h, const char *path);

/* All writers go through fio_atomic (app/file_io.h): never onto an input,
 * a temporary file then a rename, so no reader ever sees a partial file. */
ms_status image_write_indexed(const char *path, const uint8_t *idx /* (h, w) */, int w, int h,
                              const uint8_t (*palette)[3], int n_palette);
ms_status image_write_gray(const char *path, const uint8_t *px /* (h, w) */, int w, int h);
ms_status image_write_rgb(const char *path, const uint8_t *px /* (h, w, 3) */, int w, int h);
ms_status image_write_rgba(const char *path, const uint8_t *px /* (h, w, 4) */, int w, int h);

#endif
