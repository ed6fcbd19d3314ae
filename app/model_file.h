/* Reading and writing safetensors files: the model file (model-format.md) and
 * the --dump output. The reader reads the file into memory (a file changed
 * meanwhile is an error, never a crash) and validates every byte range before
 * anything is used. */
#ifndef MS_MODEL_FILE_H
#define MS_MODEL_FILE_H

#include "backbone/config.h"

/* The safetensors dtypes. Weights may be F32, F16, BF16 or F64 (converted to
 * F32 at load); the others may sit in a file (e.g. BatchNorm's I64
 * num_batches_tracked in a raw state dict) but are never read as weights. */
typedef enum {
    MS_DT_F32 = 0, MS_DT_F16, MS_DT_BF16, MS_DT_I32, MS_DT_U8,
    MS_DT_F64, MS_DT_I64, MS_DT_I16, MS_DT_I8, MS_DT_U16, MS_DT_U32, MS_DT_U64, MS_DT_BOOL,
    MS_DT_COUNT
} ms_dtype;

#define MS_MAX_DIMS 8

typedef struct {
    const char *name;
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    const void *data;     /* into the file's bytes (read) or caller memory (write) */
    size_t nbytes;
} ms_tensor;

typedef struct ms_model_file ms_model_file;

/* Read + validate container, header and config. Errors start with the path. */
ms_status model_file_open(ms_model_file **out, const char *path);
void model_file_close(ms_model_file *mf);
/* The same validation of the container, for any safetensors file (goldens,
 * dumps): no mitaseg metadata or config required; model_file_config is NULL. */
ms_status safetensors_open(ms_model_file **out, const char *path);
/* A __metadata__ value, or NULL. */
const char *model_file_metadata(const ms_model_file *mf, const char *key);
const char *model_file_path(const ms_model_file *mf);
const ms_config *model_file_config(const ms_model_file *mf);
int model_file_count(const ms_model_file *mf);
const ms_tensor *model_file_tensor(const ms_model_file *mf, int i);
const ms_tensor *model_file_find(const ms_model_file *mf, const char *name);
/* Checks that tensor `name` exists with exactly shape[0..ndim) and a float
 * dtype. Missing or misshaped: an error naming the file, the tensor and both
 * shapes. */
ms_status model_file_check_f32(const ms_model_file *mf, const char *name, int ndim, const int64_t *shape);
/* Copies tensor `name` into dst as F32 (F16/BF16/F64 converted) after
 * model_file_check_f32. */
ms_status model_file_read_f32(const ms_model_file *mf, const char *name, float *dst,
                              int ndim, const int64_t *shape);

/* Writes a safetensors file atomically (temp file + rename). metadata: NULL or
 * pairs {key, value, key, value, ..., NULL}. */
ms_status safetensors_write(const char *path, const ms_tensor *tensors, int n,
                            const char *const *metadata);

#endif
