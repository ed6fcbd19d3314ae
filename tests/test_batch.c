/* Batch plumbing: enumeration of every input form, mirrored output names, the
 * never-overwrite-an-input rule, sharding, --skip-existing and tiling. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/batch.h"
#include "testutil.h"

static char root[256];

static void touch(const char *rel, const char *content)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    ck_assert_int_eq(batch_make_parent_dirs(p), MS_OK);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(content, f);
    fclose(f);
}

static const char *at(const char *rel)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", root, rel);
    return p[k];
}

/* d/ holds images at three depths plus files enumeration must not take. */
static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/ms_test_batch_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    touch("d/a.png", "x");
    touch("d/b.JPG", "x");
    touch("d/notes.txt", "x");
    touch("d/.hidden.png", "x");
    touch("d/x.png.tmp-123", "x");
    touch("d/sub/c.jpeg", "x");
    touch("d/sub/deep/e.png", "x");
    touch("d/.git/f.png", "x");
}

static void teardown(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

static int find_rel(const ms_batch_list *l, const char *rel)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].rel, rel)) return i;
    return -1;
}

START_TEST(image_names)
{
    ck_assert(batch_is_image_name("a.png"));
    ck_assert(batch_is_image_name("a.PNG"));
    ck_assert(batch_is_image_name("a.b.jpeg"));
    ck_assert(batch_is_image_name("a.JpG"));
    ck_assert(!batch_is_image_name("a.png.tmp-99"));
    ck_assert(!batch_is_image_name(".a.png"));
    ck_assert(!batch_is_image_name("png"));
    ck_assert(!batch_is_image_name("a.gif"));
}
END_TEST

START_TEST(folder_flat_and_recursive)
{
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("d"), false), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 2);
    ck_assert_str_eq(l.items[0].rel, "a.png");
    ck_assert_str_eq(l.items[0].path, at("d/a.png"));
    ck_assert_str_eq(l.items[1].rel, "b.JPG");
    ck_assert(l.items[0].exists);
    batch_list_free(&l);

    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("d/"), true), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 4);
    ck_assert_int_ge(find_rel(&l, "sub/c.jpeg"), 0);
    ck_assert_int_ge(find_rel(&l, "sub/deep/e.png"), 0);
    /* no doubled slash from the trailing one */
    ck_assert_str_eq(l.items[find_rel(&l, "sub/c.jpeg")].path, at("d/sub/c.jpeg"));
    ck_assert_int_lt(find_rel(&l, ".git/f.png"), 0); /* hidden folders skipped */
    /* sorted by path */
    for (int i = 1; i < l.n; i++) ck_assert_int_lt(strcmp(l.items[i - 1].path, l.items[i].path), 0);
    batch_list_free(&l);
}
END_TEST

START_TEST(files_and_missing)
{
    ms_batch_list l;
    batch_list_init(&l);
    /* a file is taken whatever its name; it keeps its base name */
    ck_assert_int_eq(batch_add_path(&l, at("d/sub/c.jpeg"), false), MS_OK);
    ck_assert_int_eq(batch_add_path(&l, at("d/notes.txt"), false), MS_OK);
    ck_assert_int_eq(l.n, 2);
    ck_assert_str_eq(l.items[0].rel, "c.jpeg");
    ck_assert_str_eq(l.items[1].rel, "notes.txt");
    ck_assert_int_eq(batch_add_path(&l, at("d/nope.png"), false), MS_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "nope.png"));
    /* the same file twice is segmented once */
    ck_assert_int_eq(batch_add_path(&l, at("d/sub/c.jpeg"), false), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 2);
    batch_list_free(&l);
}
END_TEST

START_TEST(list_file)
{
    touch("d/list.txt", "a.png\n\n# a comment\n  ./sub//c.jpeg \r\n"
                        "../d/b.JPG\nmissing.png\nsub/deep\n");
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_list_file(&l, at("d/list.txt"), false), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 5);
    int i = find_rel(&l, "a.png");
    ck_assert_int_ge(i, 0);
    ck_assert_str_eq(l.items[i].path, at("d/a.png")); /* relative to the list's folder */
    i = find_rel(&l, "sub/c.jpeg");                    /* "./" and "//" dropped */
    ck_assert_int_ge(i, 0);
    ck_assert(l.items[i].exists);
    ck_assert_int_ge(find_rel(&l, "b.JPG"), 0);        /* ".." -> base name */
    ck_assert_int_ge(find_rel(&l, "e.png"), 0);        /* a listed folder's content */
    i = find_rel(&l, "missing.png");
    ck_assert_int_ge(i, 0);
    ck_assert(!l.items[i].exists); /* kept: fails later like any unreadable file */
    batch_list_free(&l);

    batch_list_init(&l);
    ck_assert_int_eq(batch_add_list_file(&l, at("d/none.txt"), false), MS_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "none.txt"));
    ck_assert_int_eq(batch_add_list_file(&l, at("d"), false), MS_ERR_ARG);
    batch_list_free(&l);
}
END_TEST

START_TEST(stdin_stream)
{
    char text[1024];
    snprintf(text, sizeof text, "%s\n%s\n", at("d/a.png"), at("d/sub/c.jpeg"));
    FILE *f = fmemopen(text, strlen(text), "r");
    ck_assert_ptr_nonnull(f);
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_stream(&l, f, "standard input", NULL, false), MS_OK);
    fclose(f);
    ck_assert_int_eq(l.n, 2);
    ck_assert_str_eq(l.items[0].path, at("d/a.png"));
    ck_assert_str_eq(l.items[0].rel, "a.png"); /* absolute: base name */
    batch_list_free(&l);

    /* absolute lines (find /data -name ... | mitaseg segment -): mirrored below
     * the deepest folder holding them all */
    touch("d/subx/c.jpeg", "x"); /* "sub" and "subx" share only d/ */
    snprintf(text, sizeof text, "%s\n%s\n%s\n%s\n", at("d/sub/deep/e.png"), at("d/sub/c.jpeg"),
             at("d/subx/c.jpeg"), at("d/nope.png"));
    f = fmemopen(text, strlen(text), "r");
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_stream(&l, f, "standard input", NULL, false), MS_OK);
    fclose(f);
    ck_assert_int_eq(batch_place_loose(&l), MS_OK);
    ck_assert_int_ge(find_rel(&l, "sub/deep/e.png"), 0);
    ck_assert_int_ge(find_rel(&l, "sub/c.jpeg"), 0);
    ck_assert_int_ge(find_rel(&l, "subx/c.jpeg"), 0);
    ck_assert_int_ge(find_rel(&l, "nope.png"), 0); /* missing: base name */
    batch_list_free(&l);
    /* one file: its base name */
    snprintf(text, sizeof text, "%s\n", at("d/sub/deep/e.png"));
    f = fmemopen(text, strlen(text), "r");
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_stream(&l, f, "standard input", NULL, false), MS_OK);
    fclose(f);
    ck_assert_int_eq(batch_place_loose(&l), MS_OK);
    ck_assert_str_eq(l.items[0].rel, "e.png");
    batch_list_free(&l);

    /* relative lines stay relative to the working directory and mirror */
    ck_assert_int_eq(chdir(root), 0);
    char rel_text[] = "d/sub/c.jpeg\n";
    f = fmemopen(rel_text, strlen(rel_text), "r");
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_stream(&l, f, "standard input", NULL, false), MS_OK);
    fclose(f);
    ck_assert_int_eq(l.n, 1);
    ck_assert_str_eq(l.items[0].path, "d/sub/c.jpeg");
    ck_assert_str_eq(l.items[0].rel, "d/sub/c.jpeg");
    ck_assert(l.items[0].exists);
    batch_list_free(&l);
    ck_assert_int_eq(chdir("/"), 0);
}
END_TEST

START_TEST(output_paths)
{
    char *p;
    ck_assert_int_eq(batch_output_path(&p, "out", "sub/c.jpeg", ".png"), MS_OK);
    ck_assert_str_eq(p, "out/sub/c.png");
    free(p);
    ck_assert_int_eq(batch_output_path(&p, "out/", "a.b.c.jpg", ".overlay.png"), MS_OK);
    ck_assert_str_eq(p, "out/a.b.c.overlay.png");
    free(p);
    ck_assert_int_eq(batch_output_path(&p, "out", "v1.0/noext", ".png"), MS_OK);
    ck_assert_str_eq(p, "out/v1.0/noext.png"); /* a dot in a folder is no extension */
    free(p);
    ck_assert_int_eq(batch_output_path(&p, "/o", ".x", ".png"), MS_OK);
    ck_assert_str_eq(p, "/o/.x.png");
    free(p);
}
END_TEST

START_TEST(inputs_never_overwritten)
{
    touch("e/x.png", "input");
    touch("e/a.jpg", "input");
    touch("e/a.png", "input");
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("e"), false), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 3);
    ck_assert_int_eq(batch_note_inputs(&l), MS_OK);
    char *out;
    /* -o is the input folder: x.png -> x.png is the input itself */
    ck_assert_int_eq(batch_output_path(&out, at("e"), "x.png", ".png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "would overwrite the input"));
    free(out);
    /* another spelling of the same folder */
    ck_assert_int_eq(batch_output_path(&out, at("e/../e/."), "x.png", ".png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_ERR_ARG);
    free(out);
    /* a.jpg -> a.png, which is another input */
    ck_assert_int_eq(batch_output_path(&out, at("e"), "a.jpg", ".png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_ERR_ARG);
    free(out);
    /* overlay names are not inputs; a new folder is fine */
    ck_assert_int_eq(batch_output_path(&out, at("e"), "a.jpg", ".overlay.png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_OK);
    free(out);
    ck_assert_int_eq(batch_output_path(&out, at("masks"), "x.png", ".png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_OK);
    free(out);
    /* an existing file that is not an input may be replaced */
    touch("masks/x.png", "old mask");
    ck_assert_int_eq(batch_output_path(&out, at("masks"), "x.png", ".png"), MS_OK);
    ck_assert_int_eq(fio_check_output(out), MS_OK);
    free(out);
    batch_list_free(&l);
}
END_TEST

/* -r over loops: loop -> . and up -> ../ would list without end (each level
 * doubling); every folder is walked once, under its real path (a link into
 * the tree, even one sorting first, adds nothing), and a link out of the
 * tree is walked. Files keep every name they have (a link to a file is an
 * input of its own name). */
START_TEST(link_loops_walked_once)
{
    touch("t/b.png", "x");
    touch("t/sub/a.png", "x");
    touch("t/run3/r.png", "x");
    touch("outside/o.png", "x");
    ck_assert_int_eq(symlink(".", at("t/sub/loop")), 0);
    ck_assert_int_eq(symlink("../", at("t/sub/up")), 0);
    ck_assert_int_eq(symlink("a.png", at("t/sub/alias.png")), 0);
    ck_assert_int_eq(symlink("run3", at("t/latest")), 0); /* "latest" sorts before "run3" */
    ck_assert_int_eq(symlink("../../outside", at("t/sub/ext")), 0);
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("t"), true), MS_OK);
    batch_sort_unique(&l);
    ck_assert_int_eq(l.n, 5);
    ck_assert_int_ge(find_rel(&l, "b.png"), 0);
    ck_assert_int_ge(find_rel(&l, "sub/a.png"), 0);
    ck_assert_int_ge(find_rel(&l, "sub/alias.png"), 0);
    ck_assert_int_ge(find_rel(&l, "run3/r.png"), 0);
    ck_assert_int_ge(find_rel(&l, "sub/ext/o.png"), 0);
    ck_assert_int_eq(l.n_bad, 0);
    batch_list_free(&l);
}
END_TEST

/* An empty sub-folder under -r (qsort(NULL, 0) was undefined behaviour,
 * caught by the sanitizer build of this test). */
START_TEST(empty_subfolders)
{
    ck_assert_int_eq(mkdir(at("empty"), 0777), 0);
    ck_assert_int_eq(mkdir(at("empty/inner"), 0777), 0);
    touch("empty/inner2/z.png", "x");
    ck_assert_int_eq(mkdir(at("empty/inner2/none"), 0777), 0);
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("empty/inner"), true), MS_OK);
    ck_assert_int_eq(l.n, 0);
    ck_assert_int_eq(batch_add_path(&l, at("empty"), true), MS_OK);
    ck_assert_int_eq(l.n, 1);
    batch_list_free(&l);
}
END_TEST

/* What cannot be added is reported, one message each, and the rest is still
 * read: a NUL byte in a list line, a dangling link or FIFO with an image's
 * name, an unreadable sub-folder. */
START_TEST(bad_entries_reported_not_dropped)
{
    char text[] = "a.png\nbad\0name.png\nb.JPG\n";
    FILE *f = fmemopen(text, sizeof text - 1, "r");
    ck_assert_ptr_nonnull(f);
    ms_batch_list l;
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_stream(&l, f, "list.txt", at("d"), false), MS_OK);
    fclose(f);
    ck_assert_int_eq(l.n, 2);
    ck_assert_int_ge(find_rel(&l, "b.JPG"), 0);
    ck_assert_int_eq(l.n_bad, 1);
    ck_assert_ptr_nonnull(strstr(l.bad[0], "list.txt:2: NUL byte"));
    batch_list_free(&l);

    touch("w/ok.png", "x");
    ck_assert_int_eq(symlink("nowhere.png", at("w/dangling.png")), 0);
    ck_assert_int_eq(mkfifo(at("w/fifo.png"), 0666), 0);
    ck_assert_int_eq(mkdir(at("w/locked"), 0), 0);
    batch_list_init(&l);
    ck_assert_int_eq(batch_add_path(&l, at("w"), true), MS_OK);
    ck_assert_int_eq(l.n, 1);
    /* root reads any folder: the locked one is then simply empty */
    int want = geteuid() == 0 ? 2 : 3;
    ck_assert_int_eq(l.n_bad, want);
    bool dangling = false, fifo = false;
    for (int i = 0; i < l.n_bad; i++) {
        dangling |= strstr(l.bad[i], "dangling.png: cannot read") != NULL;
        fifo |= strstr(l.bad[i], "fifo.png: not a regular file (a FIFO)") != NULL;
    }
    ck_assert(dangling && fifo);
    batch_list_free(&l);
    chmod(at("w/locked"), 0777);
}
END_TEST

START_TEST(collisions)
{
    char *outs[] = {"o/a.png", "o/b.png", "o/a.png", "o/c.png", "o/b.png", "o/a.png"};
    int dup[6];
    ck_assert_int_eq(batch_find_collisions(dup, outs, 6), MS_OK);
    int want[6] = {-1, -1, 0, -1, 1, 0};
    for (int i = 0; i < 6; i++) ck_assert_int_eq(dup[i], want[i]);
}
END_TEST

START_TEST(output_folder_inside_input_is_skipped)
{
    touch("d/masks/a.png", "a mask from an earlier run");
    ms_batch_list l;
    batch_list_init(&l);
    batch_list_skip_dir(&l, at("d/masks"));
    ck_assert_int_eq(batch_add_path(&l, at("d"), true), MS_OK);
    ck_assert_int_eq(l.n, 4);
    ck_assert_int_lt(find_rel(&l, "masks/a.png"), 0);
    batch_list_free(&l);
    /* named explicitly (-o = the input folder): read */
    batch_list_init(&l);
    batch_list_skip_dir(&l, at("d/masks"));
    ck_assert_int_eq(batch_add_path(&l, at("d/masks"), true), MS_OK);
    ck_assert_int_eq(l.n, 1);
    batch_list_free(&l);
}
END_TEST

START_TEST(shards_disjoint_and_covering)
{
    for (int n = 0; n < 23; n++) {
        char name[32];
        snprintf(name, sizeof name, "s/%02d.png", (n * 7) % 23); /* created out of order */
        touch(name, "x");
    }
    ms_batch_list all;
    batch_list_init(&all);
    ck_assert_int_eq(batch_add_path(&all, at("s"), false), MS_OK);
    batch_sort_unique(&all);
    ck_assert_int_eq(all.n, 23);
    for (int count = 1; count <= 25; count += (count < 8 ? 1 : 17)) {
        int seen[23] = {0};
        for (int index = 1; index <= count; index++) {
            ms_batch_list l;
            batch_list_init(&l);
            ck_assert_int_eq(batch_add_path(&l, at("s"), false), MS_OK);
            batch_sort_unique(&l);
            batch_shard(&l, index, count);
            for (int i = 0; i < l.n; i++) {
                int k = atoi(strrchr(l.items[i].path, '/') + 1);
                ck_assert_int_eq(k % count, index - 1); /* the documented rule */
                seen[k]++;
            }
            batch_list_free(&l);
        }
        for (int k = 0; k < 23; k++) ck_assert_int_eq(seen[k], 1);
    }
    batch_list_free(&all);

    int i, n;
    ck_assert_int_eq(batch_parse_shard(&i, &n, "2/8"), MS_OK);
    ck_assert_int_eq(i, 2);
    ck_assert_int_eq(n, 8);
    ck_assert_int_eq(batch_parse_shard(&i, &n, "1/1"), MS_OK);
    const char *bad[] = {"0/3", "4/3", "3", "a/b", "2/3x", "/3", "2/", "-1/3", "1/0", ""};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        ck_assert_int_eq(batch_parse_shard(&i, &n, bad[k]), MS_ERR_ARG);
}
END_TEST

START_TEST(skip_existing)
{
    ck_assert(!batch_output_done(at("o/a.png")));
    touch("o/a.png.tmp-4242", "partial"); /* an interrupted write */
    ck_assert(!batch_output_done(at("o/a.png")));
    touch("o/a.png", "");
    ck_assert(!batch_output_done(at("o/a.png"))); /* empty: not a finished PNG */
    touch("o/a.png", "done");
    ck_assert(batch_output_done(at("o/a.png")));
    ck_assert(!batch_output_done(at("o"))); /* a folder is no output */
}
END_TEST

START_TEST(parent_dirs)
{
    ck_assert_int_eq(batch_make_parent_dirs(at("p/q/r/x.png")), MS_OK);
    struct stat sb;
    ck_assert_int_eq(stat(at("p/q/r"), &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    ck_assert_int_eq(batch_make_parent_dirs(at("p/q/r/x.png")), MS_OK); /* again: fine */
    touch("file", "x");
    ck_assert_int_eq(batch_make_parent_dirs(at("file/x.png")), MS_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "file"));
}
END_TEST

START_TEST(tile_windows)
{
    int s[8];
    ck_assert_int_eq(batch_tile_starts(s, 10, 4, 1), 3);
    ck_assert_int_eq(s[0], 0);
    ck_assert_int_eq(s[1], 3);
    ck_assert_int_eq(s[2], 6);
    ck_assert_int_eq(batch_tile_starts(s, 11, 4, 1), 4);
    ck_assert_int_eq(s[2], 6);
    ck_assert_int_eq(s[3], 7); /* flush with the end, not hanging out */
    ck_assert_int_eq(batch_tile_starts(s, 4, 4, 2), 1);
    ck_assert_int_eq(batch_tile_starts(s, 3, 4, 2), 1);
    ck_assert_int_eq(s[0], 0);
    ck_assert_int_eq(batch_tile_starts(s, 5, 4, 0), 2);
    ck_assert_int_eq(s[1], 1);
}
END_TEST

/* Class 0's logit is the call number, class 1's is 0.75 everywhere; pixel
 * values must arrive with the crop's geometry (checked via the red channel). */
typedef struct {
    int calls;
    float buf[2 * 16];
    int w;
    bool geometry_ok;
} tile_ctx;

static ms_status fake_run(void *vctx, const float **logits, const uint8_t *crop, int cw, int ch)
{
    tile_ctx *c = vctx;
    for (int y = 0; y < ch; y++)
        for (int x = 0; x < cw; x++) {
            c->buf[y * cw + x] = (float)c->calls;
            c->buf[cw * ch + y * cw + x] = 0.75f;
            /* red = global x, green = y: the crop is the image's window */
            if (crop[(y * cw + x) * 3 + 1] != y) c->geometry_ok = false;
        }
    c->calls++;
    *logits = c->buf;
    return MS_OK;
}

START_TEST(tiled_average)
{
    enum { W = 10, H = 4 };
    uint8_t rgb[H * W * 3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            rgb[(y * W + x) * 3] = (uint8_t)x;
            rgb[(y * W + x) * 3 + 1] = (uint8_t)y;
            rgb[(y * W + x) * 3 + 2] = 0;
        }
    uint8_t mask[H * W];
    float logits[2 * H * W];
    tile_ctx c = {.geometry_ok = true};
    /* windows x0 = 0, 3, 6 (calls 0, 1, 2), one row of windows */
    ck_assert_int_eq(batch_run_tiled(mask, logits, rgb, W, H, 2, 4, 1, fake_run, &c), MS_OK);
    ck_assert_int_eq(c.calls, 3);
    ck_assert(c.geometry_ok);
    /* exact: averages of small integers are exact in float */
    float want0[W] = {0, 0, 0, 0.5f, 1, 1, 1.5f, 2, 2, 2};
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            ck_assert_float_eq(logits[y * W + x], want0[x]);
            ck_assert_float_eq(logits[H * W + y * W + x], 0.75f);
            ck_assert_int_eq(mask[y * W + x], want0[x] > 0.75f ? 0 : 1);
        }
    /* the mask alone, without keeping logits */
    uint8_t mask2[H * W];
    c.calls = 0;
    ck_assert_int_eq(batch_run_tiled(mask2, NULL, rgb, W, H, 2, 4, 1, fake_run, &c), MS_OK);
    ck_assert_mem_eq(mask, mask2, sizeof mask);
    ck_assert_int_eq(batch_run_tiled(mask2, NULL, rgb, W, H, 2, 4, 4, fake_run, &c), MS_ERR_ARG);
    /* Stride 1 on a 4-pixel tile runs each pixel about 16 times: allowed;
     * a 16-pixel tile with stride 1 (256 times) is refused before any run. */
    ck_assert_int_eq(batch_run_tiled(mask2, NULL, rgb, W, H, 2, 4, 3, fake_run, &c), MS_OK);
    int calls = c.calls;
    uint8_t *big = calloc(64 * 64 * 3, 1), *bmask = malloc(64 * 64);
    ck_assert_int_eq(batch_run_tiled(bmask, NULL, big, 64, 64, 2, 16, 15, fake_run, &c), MS_ERR_ARG);
    ck_assert_msg(strstr(ms_last_error(), "would run each pixel"), "%s", ms_last_error());
    ck_assert_int_eq(c.calls, calls);
    free(big), free(bmask);
}
END_TEST

START_TEST(colours_and_blend)
{
    const uint8_t pal[2][3] = {{255, 0, 0}, {0, 100, 200}};
    uint8_t mask[3] = {0, 1, 7};
    uint8_t rgb[9], out[9];
    batch_colorize(rgb, mask, 3, pal, 2);
    const uint8_t want[9] = {255, 0, 0, 0, 100, 200, 0, 0, 0};
    ck_assert_mem_eq(rgb, want, 9);
    const uint8_t img[9] = {0, 0, 0, 255, 255, 255, 10, 11, 12};
    batch_blend(out, img, mask, 3, pal, 2);
    const uint8_t wantb[9] = {128, 0, 0, 128, 178, 228, 5, 6, 6}; /* (a + b + 1) / 2 */
    ck_assert_mem_eq(out, wantb, 9);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("batch");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, image_names);
    tcase_add_test(tc, folder_flat_and_recursive);
    tcase_add_test(tc, files_and_missing);
    tcase_add_test(tc, list_file);
    tcase_add_test(tc, stdin_stream);
    tcase_add_test(tc, output_paths);
    tcase_add_test(tc, inputs_never_overwritten);
    tcase_add_test(tc, link_loops_walked_once);
    tcase_add_test(tc, empty_subfolders);
    tcase_add_test(tc, bad_entries_reported_not_dropped);
    tcase_add_test(tc, collisions);
    tcase_add_test(tc, output_folder_inside_input_is_skipped);
    tcase_add_test(tc, shards_disjoint_and_covering);
    tcase_add_test(tc, skip_existing);
    tcase_add_test(tc, parent_dirs);
    tcase_add_test(tc, tile_windows);
    tcase_add_test(tc, tiled_average);
    tcase_add_test(tc, colours_and_blend);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
