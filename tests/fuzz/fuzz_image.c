/* libFuzzer harness: the image decoders. One input is read as an image (PNG
 * or JPEG, every colour type and bit depth, EXIF orientation) with the size
 * check the commands use (here: at most 4 Mpixels, as a memory budget would),
 * and as a label PNG (raw 8-bit values). Whatever decodes must have the size
 * its header gave. */
#define _GNU_SOURCE /* memfd_create */
#include <string.h>

#include "app/image_io.h"
#include "fuzz_common.h"

#define FUZZ_MAX_PIXELS (1 << 22)

static volatile uint8_t fuzz_sink;

static ms_status size_check(void *user, int w, int h)
{
    int *seen = user;
    seen[0] = w, seen[1] = h;
    if ((int64_t)w * h > FUZZ_MAX_PIXELS) return ms_error(MS_ERR_OOM, "over the fuzzing budget");
    return MS_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    fuzz_file(&fd, path, "fuzz-image", data, size);

    ms_image img;
    int seen[2] = {0, 0};
    if (image_read_checked(&img, path, size_check, seen) == MS_OK) {
        if (img.w != seen[0] || img.h != seen[1] || !img.rgb) abort();
        /* Touch every byte: ASan checks the extent. */
        for (size_t i = 0; i < (size_t)img.w * img.h * 3; i++) fuzz_sink += img.rgb[i];
        image_free(&img);
    }
    /* Labels have no size check of their own; keep the fuzzer's allocations
     * sane by decoding only what the image check allowed. */
    if ((int64_t)seen[0] * seen[1] <= FUZZ_MAX_PIXELS) {
        uint8_t *lab = NULL;
        int w, h;
        if (image_read_label(&lab, &w, &h, path) == MS_OK) {
            for (size_t i = 0; i < (size_t)w * h; i++) fuzz_sink += lab[i];
            free(lab);
        }
    }
    return 0;
}
