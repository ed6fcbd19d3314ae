/* The engine: a loaded model plus the backend it runs on. engine_run takes an
 * RGB image and returns logits, the mask and (when asked) every MiTA layer's
 * selections; engine_run_batch does the same for several same-size images in
 * one forward pass. Library code: no printing, errors via ms_last_error(). */
#ifndef MS_ENGINE_H
#define MS_ENGINE_H

#include "backbone/config.h"
#include "image_io.h"

typedef enum { MS_DEV_AUTO = -1, MS_DEV_CPU = 0, MS_DEV_CUDA = 1 } ms_device_choice;

typedef struct {
    ms_device_choice device;
    int threads;        /* 0: all cores */
    bool fp32;          /* CUDA: FP32 GEMMs */
    bool tc_round;      /* CPU: round GEMM operands as CUDA's tensor-core mode
                         * does (ms_backend.tc_round; verification only) */
    int device_index;   /* CUDA: which GPU (0-based, counted within
                         * CUDA_VISIBLE_DEVICES); 0 when unset */
    size_t max_memory;  /* host bytes a run may hold, weights included;
                         * 0: engine_default_memory_budget() */
} ms_engine_options;

/* Per-run attention override; zero/negative fields keep the model's. */
typedef struct {
    int attention;      /* -1: model's; MS_ATTN_FULL; MS_ATTN_MITA */
    int gh, gw;         /* landmarks, 0: model's */
    int topk;           /* 0: model's */
    int short_side;     /* working size's short side: 0 the model's
                         * input.short_side, -1 native (no resize), else
                         * 1..4096 (the model's input.long_side still caps
                         * the long side) */
    bool record;        /* record MiTA selections (viewer, --dump) */
    bool tta_flip;      /* test-time augmentation: average the logits of the
                         * image and of its mirror image (mirrored back); the
                         * mask is their argmax, the MiTA record the unflipped
                         * pass's. The mirror runs in the same batch. */
    bool mask_only;     /* no full-size logits (res->logits NULL): the mask
                         * is the argmax taken while resizing, band by band,
                         * so memory does not grow with classes x pixels */
    bool keep_blocks;   /* keep every block's output tokens (depth chart, --stats) */
} ms_run_options;

typedef struct {
    /* image and network geometry */
    int h, w;               /* original image */
    int rh, rw;             /* resized (working) size, before padding */
    int ph, pw;             /* padded network input */
    int patch, hp, wp, n;   /* token grid, n = hp*wp */
    int ncls;               /* 1 with a class token: records number it n (mita-spec 2.7) */
    int classes;
    float *logits;          /* (classes, h, w) at the original size, before
                             * argmax; NULL after a mask_only run */
    uint8_t *mask;          /* (h, w) */
    /* MiTA record (record=true); layers run with full attention have
     * layer_mita[i] == 0 and their slices are unset. */
    int depth, heads;
    int gh, gw, m, k;       /* effective (clamped) landmark grid and k */
    uint8_t *layer_mita;    /* (depth) */
    int32_t *topk_idx;      /* (depth, heads, m, k): positions 0..n-1, class token n */
    int32_t *route;         /* (depth, heads, n + ncls), the class token's last */
    float *shared_mass;     /* (depth, heads, n + ncls), the class token's last */
    /* keep_blocks: every block's output grid tokens (no class token), MiTA or full */
    int dim;                /* token width C; 0 without blocks */
    float *blocks;          /* (depth, n, dim) or NULL */
    /* run facts */
    int attention;          /* MS_ATTN_* actually used */
    bool tta_flip;          /* logits averaged with the mirror image's */
    double ms_total;        /* wall time of the forward pass; in a batch of
                             * count images, the batch's time / count */
    char device_name[64];
} ms_result;

typedef struct ms_engine ms_engine;

/* Loads and validates the model, folds BatchNorm, picks the device. When auto
 * falls back to the CPU, engine_fallback_reason() says why. */
ms_status engine_init(ms_engine **out, const char *model_path, const ms_engine_options *opt);
void engine_free(ms_engine *e);
/* What engine_init checks of a model without keeping it: every tensor the
 * config implies is there with its shape and a float dtype, and every weight
 * is finite. For `mitaseg info`. */
struct ms_model_file;
ms_status engine_check_model(const struct ms_model_file *mf);
const ms_config *engine_config(const ms_engine *e);
const char *engine_model_path(const ms_engine *e);
const char *engine_fallback_reason(const ms_engine *e); /* NULL when none */
ms_device_choice engine_device(const ms_engine *e);

/* Runs one image. res is filled with buffers owned by res (result_free);
 * passing the same res again reuses its buffers when sizes match.
 * engine_run_batch with count 1. */
ms_status engine_run(ms_engine *e, ms_result *res, const ms_image *img, const ms_run_options *opt);
/* Runs count images of one size (else MS_ERR_ARG) in one forward pass: the
 * backbone's LayerNorms, linears and MLPs run once over all images' tokens;
 * the stem, attention, neck, head and postprocessing image by image. res[b]
 * gets image b's result as engine_run would give it (logits equal up to GEMM
 * rounding, which may depend on the row count). The activation plan is keyed
 * on size, options and count: a repeated count allocates nothing new.
 * On CUDA an engine may be run from any thread, one thread at a time. */
ms_status engine_run_batch(ms_engine *e, ms_result *res /* (count) */,
                           const ms_image *const *imgs /* (count) */, int count,
                           const ms_run_options *opt);
void result_free(ms_result *res);

/* Refuses (MS_ERR_OOM, a message with the sizes) a run of count h x w images
 * whose plan, plus extra_bytes the caller will hold (the decoded image), would
 * exceed the engine's memory budget; allocates nothing (a dry run sizes it).
 * engine_run_batch applies the same check before it allocates a new plan;
 * callers use this one before decoding an image. */
ms_status engine_check_memory(ms_engine *e, int count, int h, int w, const ms_run_options *opt,
                              size_t extra_bytes);
size_t engine_memory_budget(const ms_engine *e);
/* Half of physical memory (or of the cgroup's limit when lower): the budget
 * when ms_engine_options.max_memory is 0. */
size_t engine_default_memory_budget(void);

/* The short side a run resizes images to: opt's short_side, else the
 * model's input.short_side; 0: native (no resize). */
int engine_short_side(const ms_config *c, const ms_run_options *opt);

/* Writes the --dump safetensors (logits, mask, layers.{i}.topk_idx/route/
 * shared_mass when recorded, blocks.{i} when kept). */
ms_status result_write_dump(const ms_result *res, const char *path);

/* Test hook: called with every stage's output (host copy), named as in the
 * golden fixtures (tests/fixtures, tools/gen_fixtures.py). NULL turns it off.
 * In a batch, each per-image stage is called once per image, in image order. */
typedef void (*engine_trace_fn)(void *user, const char *name, const float *data, int ndim,
                                const int64_t *shape);
void engine_set_trace(ms_engine *e, engine_trace_fn fn, void *user);

/* Landmark m's pooling window on the token grid (spec 2.1). */
void mita_landmark_window(int *r0, int *r1, int *c0, int *c1, int m, int hp, int wp, int gh, int gw);

#endif
