/* What the engine (and `mitaseg info`) refuse in a model whose container is
 * valid: a config that disagrees with its tensors (named by file and tensor,
 * before anything is sized), NaN/Inf weights (named by tensor), and config
 * values that would make an image's work absurd; and a forward pass whose
 * logits overflow is an error for that image, not a mask. Each model here is
 * the tiny fixture with one thing changed. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "testutil.h"

static void setup(void) { test_dir_create("model_check"); }
static void teardown(void) { test_dir_remove(); }

/* Edits applied to a copy of the tiny model. */
typedef struct {
    const char *key_path[3];  /* config key to set, e.g. {"backbone", "embed_dim"} */
    const char *json_value;   /* its new value as JSON */
    const char *tensor;       /* tensor whose elements are overwritten, or NULL */
    float value;              /* ... with this value */
    size_t count;             /* ... this many of them (from index 0), 0: all */
} edit;

/* Writes the tiny fixture model with `ed` applied to `out`. */
static void write_edited(const char *out, const edit *ed)
{
    ms_model_file *mf;
    ck_assert_msg(safetensors_open(&mf, fixture_path("tiny.model.safetensors")) == MS_OK, "%s",
                  ms_last_error());
    int n = model_file_count(mf);
    ms_tensor *t = calloc((size_t)n, sizeof *t);
    void **owned = calloc((size_t)n, sizeof *owned);
    for (int i = 0; i < n; i++) {
        t[i] = *model_file_tensor(mf, i);
        if (ed->tensor && !strcmp(t[i].name, ed->tensor)) {
            ck_assert_int_eq(t[i].dtype, MS_DT_F32);
            float *d = malloc(t[i].nbytes);
            memcpy(d, t[i].data, t[i].nbytes);
            size_t cnt = ed->count ? ed->count : t[i].nbytes / 4;
            for (size_t k = 0; k < cnt; k++) d[k] = ed->value;
            t[i].data = owned[i] = d;
        }
    }
    cJSON *cfg = cJSON_Parse(model_file_metadata(mf, "config"));
    if (ed->key_path[0]) {
        cJSON *o = cfg;
        int k = 0;
        while (ed->key_path[k + 1]) o = cJSON_GetObjectItemCaseSensitive(o, ed->key_path[k++]);
        ck_assert_ptr_nonnull(o);
        cJSON_ReplaceItemInObjectCaseSensitive(o, ed->key_path[k], cJSON_Parse(ed->json_value));
    }
    char *cs = cJSON_PrintUnformatted(cfg);
    const char *meta[] = {"format", "mitaseg", "format_version", "1", "config", cs, NULL};
    ck_assert_msg(safetensors_write(out, t, n, meta) == MS_OK, "%s", ms_last_error());
    free(cs);
    cJSON_Delete(cfg);
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(t);
    model_file_close(mf);
}

static ms_status open_engine(ms_engine **e, const char *path)
{
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 1};
    *e = NULL;
    return engine_init(e, path, &eo);
}

/* `mitaseg info path`: its exit status, its stderr in err (cap bytes). */
static int run_info(const char *path, char *err, size_t cap)
{
    const char *bin = getenv("MS_BIN");
    if (!bin) return -1;
    char cmd[2048];
    const char *errf = test_path("info.err");
    snprintf(cmd, sizeof cmd, "'%s' info --no-tensors '%s' > /dev/null 2> '%s'", bin, path, errf);
    int rc = system(cmd);
    size_t n;
    uint8_t *b = read_bytes(errf, &n);
    snprintf(err, cap, "%.*s", (int)n, (const char *)b);
    free(b);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The engine refuses path with a message naming the file and `what`; so does
 * `mitaseg info` (exit 1, one line). */
static void assert_refused(const char *path, const char *what)
{
    ms_engine *e;
    ms_clear_error();
    ck_assert_int_ne(open_engine(&e, path), MS_OK);
    ck_assert_ptr_null(e);
    assert_error_names(path, what);
    ck_assert_msg(strstr(ms_last_error(), "arena") == NULL, "arena in: %s", ms_last_error());
    char err[2048];
    int rc = run_info(path, err, sizeof err);
    if (rc == -1) return; /* no MS_BIN: library-only run */
    ck_assert_msg(rc == 1, "info exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, path) && strstr(err, what), "info said: %s", err);
    ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "more than one line: %s", err);
}

/* One edit of the tiny model and what its refusal must say. */
static const struct {
    edit ed;
    const char *says;
} refused[] = {
    /* A config wider than its tensors: this gave "arena exhausted: need
     * 50331648 bytes", naming neither the file nor the tensor. */
    {{.key_path = {"backbone", "embed_dim", NULL}, .json_value = "65536"},
     "tensor backbone.patch_embed.proj.weight has shape (24, 3, 8, 8), expected (65536, 3, 8, 8)"},
    {{.key_path = {"backbone", "pos_grid", NULL}, .json_value = "[4096, 4096]"},
     "tensor backbone.pos_embed has shape (1, 48, 24), expected (1, 16777216, 24)"},
    {{.key_path = {"decoder", "channels", NULL}, .json_value = "4096"},
     "tensor decode_head.psp_modules.0.1.conv.weight has shape"},
    /* Non-finite weights, named by tensor; a BatchNorm weight is folded away
     * at load, so it is checked before folding. */
    {{.tensor = "backbone.blocks.2.attn.qkv.weight", .value = NAN, .count = 1},
     "tensor backbone.blocks.2.attn.qkv.weight has a non-finite value"},
    {{.tensor = "decode_head.bottleneck.bn.weight", .value = -INFINITY, .count = 3},
     "tensor decode_head.bottleneck.bn.weight has a non-finite value"},
    /* Work absurd for any image: pad_multiple 4096 made a 16x12 image a
     * 4096x4096 input. */
    {{.key_path = {"input", "pad_multiple", NULL}, .json_value = "4096"},
     "input.pad_multiple: 4096 out of range 1..256"},
    {{.key_path = {"input", "short_side", NULL}, .json_value = "60000"},
     "input.short_side: 60000 out of range 1..4096"},
};

START_TEST(test_refused_models)
{
    const char *p = test_path("edited.safetensors");
    write_edited(p, &refused[_i].ed);
    assert_refused(p, refused[_i].says);
}
END_TEST

/* Finite but huge classifier weights overflow the logits to Inf/NaN: an
 * error for that image (the run's message says so), never a mask. */
START_TEST(test_overflowing_logits_are_an_error)
{
    const char *p = test_path("huge.safetensors");
    edit ed = {.tensor = "decode_head.conv_seg.weight", .value = 3e38f};
    write_edited(p, &ed);
    ms_engine *e;
    ck_assert_msg(open_engine(&e, p) == MS_OK, "%s", ms_last_error());
    uint8_t rgb[30 * 20 * 3];
    for (size_t i = 0; i < sizeof rgb; i++) rgb[i] = (uint8_t)(i * 37);
    ms_image img = {.w = 30, .h = 20, .rgb = rgb};
    ms_result res = {0};
    ms_run_options opt = {.attention = -1};
    ms_clear_error();
    ck_assert_int_ne(engine_run(e, &res, &img, &opt), MS_OK);
    ck_assert_msg(strstr(ms_last_error(), "non-finite logits"), "%s", ms_last_error());
    opt.mask_only = true;
    ck_assert_int_ne(engine_run(e, &res, &img, &opt), MS_OK);
    ck_assert_msg(strstr(ms_last_error(), "non-finite logits"), "%s", ms_last_error());
    result_free(&res);
    engine_free(e);

    /* The unedited model runs the same image. */
    ck_assert_int_eq(open_engine(&e, fixture_path("tiny.model.safetensors")), MS_OK);
    ck_assert_msg(engine_run(e, &res, &img, &opt) == MS_OK, "%s", ms_last_error());
    result_free(&res);
    engine_free(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_check");
    TCase *tc = tcase_create("check");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_refused_models, 0, (int)(sizeof refused / sizeof refused[0]));
    tcase_add_test(tc, test_overflowing_logits_are_an_error);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
