/* libFuzzer harness: a model file. Container and header (safetensors_open),
 * config and tensor table (model_file_open), every tensor read in bounds,
 * the engine's checks (engine_check_model: shapes against the config, finite
 * weights); and when the file is small, engine_init and one forward pass on a
 * 24x18 image under a 64 MB memory budget (larger plans are refused, which is
 * also checked: nothing may be allocated past the budget). */
#define _GNU_SOURCE /* memfd_create */
#include <string.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    fuzz_file(&fd, path, "fuzz-model", data, size);

    ms_model_file *mf = NULL;
    if (safetensors_open(&mf, path) == MS_OK) model_file_close(mf);
    if (model_file_open(&mf, path) != MS_OK) return 0;
    for (int i = 0; i < model_file_count(mf); i++) {
        const ms_tensor *t = model_file_tensor(mf, i);
        size_t n = t->nbytes; /* >= element count for every float dtype */
        float *buf = malloc(n ? n * 2 : 1);
        (void)model_file_read_f32(mf, t->name, buf, t->ndim, t->shape);
        free(buf);
    }
    ms_status st = engine_check_model(mf);
    model_file_close(mf);
    if (st != MS_OK || size > (1u << 20)) return 0;

    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 1, .max_memory = (size_t)64 << 20};
    ms_engine *e = NULL;
    if (engine_init(&e, path, &eo) != MS_OK) return 0;
    uint8_t rgb[18][24][3];
    for (int y = 0; y < 18; y++)
        for (int x = 0; x < 24; x++)
            for (int c = 0; c < 3; c++) rgb[y][x][c] = (uint8_t)(x * 10 + y * 7 + c * 60);
    ms_image img = {.w = 24, .h = 18, .rgb = &rgb[0][0][0]};
    ms_result res = {0};
    ms_run_options opt = {.attention = -1, .mask_only = size & 1, .record = (size & 2) != 0};
    if (engine_run(e, &res, &img, &opt) == MS_OK) {
        for (int i = 0; i < 24 * 18; i++)
            if (res.mask[i] >= engine_config(e)->n_classes) abort(); /* a class that is not there */
    }
    result_free(&res);
    engine_free(e);
    return 0;
}
