/* Batch mode plumbing: input enumeration, sharding, output names, tiles. */
#define _GNU_SOURCE /* vasprintf */
#include "batch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "kernels/elementwise.h" /* slide_windows, slide_start */

/* A folder found through a symbolic link, walked after the real tree. */
struct ms_batch_link {
    char *dir, *rel;    /* owned */
    int depth;
};

void batch_list_init(ms_batch_list *l) { memset(l, 0, sizeof *l); }

/* arr (n used of *cap elements of `size` bytes) with room for one more,
 * doubling from `first`: the array to use from now on, or NULL when out of
 * memory (arr is then still valid and unchanged). */
static void *grow(void *arr, int *cap, int n, int first, size_t size)
{
    if (n < *cap) return arr;
    int c = *cap ? 2 * *cap : first;
    void *p = realloc(arr, (size_t)c * size);
    if (p) *cap = c;
    return p;
}

void batch_list_free(ms_batch_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->items[i].path);
        free(l->items[i].rel);
    }
    free(l->items);
    for (int i = 0; i < l->n_bad; i++) free(l->bad[i]);
    free(l->bad);
    fio_id_set_free(&l->visited);
    for (int i = 0; i < l->n_linked; i++) {
        free(l->linked[i].dir);
        free(l->linked[i].rel);
    }
    free(l->linked);
    memset(l, 0, sizeof *l);
}

/* Records an entry that could not be added; only running out of memory
 * stops the enumeration. */
static ms_status add_bad(ms_batch_list *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ms_status add_bad(ms_batch_list *l, const char *fmt, ...)
{
    char **nb = grow(l->bad, &l->cap_bad, l->n_bad, 16, sizeof *l->bad);
    if (!nb)
        return ms_error(MS_ERR_OOM, "out of memory: %d batch errors at %s:%d", l->n_bad + 1,
                        __FILE__, __LINE__);
    l->bad = nb;
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (n < 0) return ms_error(MS_ERR_OOM, "out of memory: a batch error message");
    l->bad[l->n_bad++] = msg;
    return MS_OK;
}

void batch_list_skip_dir(ms_batch_list *l, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
        l->skip_dev = st.st_dev;
        l->skip_ino = st.st_ino;
        l->has_skip = true;
    }
}

bool batch_is_image_name(const char *name)
{
    if (name[0] == '.') return false;
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return false;
    return !strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg");
}

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* a + "/" + b, without doubling a trailing slash of a; "" a gives b. */
static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la == 0) return str_dup(b);
    bool slash = a[la - 1] == '/';
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    size_t o = la;
    if (!slash) p[o++] = '/';
    memcpy(p + o, b, lb + 1);
    return p;
}

/* Takes ownership of path and rel. */
static ms_status list_push(ms_batch_list *l, char *path, char *rel)
{
    if (!path || !rel) {
        free(path);
        free(rel);
        return ms_error(MS_ERR_OOM, "out of memory: batch path at %s:%d", __FILE__, __LINE__);
    }
    ms_batch_item *items = grow(l->items, &l->cap, l->n, 64, sizeof *l->items);
    if (!items) {
        free(path);
        free(rel);
        return ms_error(MS_ERR_OOM, "out of memory: %d batch items at %s:%d", l->n + 1,
                        __FILE__, __LINE__);
    }
    l->items = items;
    ms_batch_item *it = &l->items[l->n++];
    memset(it, 0, sizeof *it);
    it->path = path;
    it->rel = rel;
    struct stat st;
    if (stat(path, &st) == 0) {
        it->exists = true;
        it->dev = st.st_dev;
        it->ino = st.st_ino;
    }
    return MS_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Takes ownership of dir and rel. */
static ms_status push_linked(ms_batch_list *l, char *dir, char *rel, int depth)
{
    struct ms_batch_link *linked = grow(l->linked, &l->cap_linked, l->n_linked, 16,
                                        sizeof *l->linked);
    if (!linked) {
        free(dir);
        free(rel);
        return ms_error(MS_ERR_OOM, "out of memory: %d linked folders at %s:%d",
                        l->n_linked + 1, __FILE__, __LINE__);
    }
    l->linked = linked;
    l->linked[l->n_linked++] = (struct ms_batch_link){dir, rel, depth};
    return MS_OK;
}

/* Adds the image files of dir (rel_prefix + name as rel), descending when
 * recursive into folders not walked before (by identity: a link back up the
 * tree adds nothing); folders behind a symbolic link go to l->linked.
 * Entries are sorted here only for a stable error order; the list is sorted
 * as a whole later. Only the top folder (depth 0) failing to open is an
 * error; below it, what cannot be read goes to l->bad. */
static ms_status add_dir(ms_batch_list *l, const char *dir, const char *rel_prefix,
                         bool recursive, int depth)
{
    if (depth > 64)
        return add_bad(l, "%s: folders nested deeper than 64 levels; not read", dir);
    DIR *d = opendir(dir);
    if (!d) {
        if (depth == 0) return ms_error(MS_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
        return add_bad(l, "%s: cannot open folder: %s", dir, strerror(errno));
    }
    struct stat dsb;
    if (fstat(dirfd(d), &dsb) == 0 &&
        fio_id_set_add(&l->visited, dsb.st_dev, dsb.st_ino, 0, NULL) < 0) {
        closedir(d);
        return ms_error(MS_ERR_OOM, "out of memory: listing %s", dir);
    }
    char **names = NULL;
    int n = 0, cap = 0;
    ms_status st = MS_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue; /* ., .., hidden files and folders */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) { st = ms_error(MS_ERR_OOM, "out of memory: listing %s", dir); break; }
            names = nn;
        }
        if (!(names[n] = str_dup(de->d_name))) {
            st = ms_error(MS_ERR_OOM, "out of memory: listing %s", dir);
            break;
        }
        n++;
    }
    closedir(d);
    /* n == 0 leaves names NULL, which qsort must not be given */
    if (st == MS_OK && n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n && st == MS_OK; i++) {
        char *full = path_join(dir, names[i]);
        char *rel = path_join(rel_prefix, names[i]);
        if (!full || !rel) {
            free(full);
            free(rel);
            st = ms_error(MS_ERR_OOM, "out of memory: listing %s", dir);
            break;
        }
        struct stat sb;
        bool image = batch_is_image_name(names[i]);
        if (stat(full, &sb) != 0) {
            /* a dangling link, a link loop, no permission: reported when it
             * looks like an image, so no image is dropped silently */
            if (image) st = add_bad(l, "%s: cannot read: %s", full, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            bool skip = !recursive ||
                        (l->has_skip && sb.st_dev == l->skip_dev && sb.st_ino == l->skip_ino) ||
                        fio_id_set_find(&l->visited, sb.st_dev, sb.st_ino) >= 0;
            struct stat lsb;
            if (!skip && lstat(full, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
                st = push_linked(l, full, rel, depth + 1);
                full = rel = NULL; /* owned by l->linked now */
            } else if (!skip) {
                st = add_dir(l, full, rel, recursive, depth + 1);
            }
        } else if (image && !S_ISREG(sb.st_mode)) {
            st = add_bad(l, "%s: not a regular file (%s)", full, fio_kind_name(sb.st_mode));
        } else if (image) {
            st = list_push(l, full, rel);
            full = rel = NULL; /* owned by the list now */
        }
        free(full);
        free(rel);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* The name a file given by this spelling gets under -o: the relative path
 * without "." components when it stays inside (no ".."), else the base name
 * for now (*loose: batch_place_loose may give it its folders back). */
static char *rel_for(const char *spelled, bool *loose)
{
    *loose = true;
    if (spelled[0] != '/') {
        size_t n = strlen(spelled);
        char *out = malloc(n + 1);
        if (!out) return NULL;
        size_t o = 0;
        bool inside = true;
        const char *p = spelled;
        while (*p) {
            const char *e = strchr(p, '/');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len == 2 && p[0] == '.' && p[1] == '.') { inside = false; break; }
            if (len > 0 && !(len == 1 && p[0] == '.')) {
                if (o) out[o++] = '/';
                memcpy(out + o, p, len);
                o += len;
            }
            p += len;
            while (*p == '/') p++;
        }
        out[o] = '\0';
        if (inside && o > 0) {
            *loose = false;
            return out;
        }
        free(out);
    }
    return str_dup(base_name(spelled));
}

static ms_status push_spelled(ms_batch_list *l, const char *path, const char *rel_source)
{
    bool loose;
    MS_TRY(list_push(l, str_dup(path), rel_for(rel_source, &loose)));
    l->items[l->n - 1].loose = loose;
    return MS_OK;
}

/* The folders found through links, once the real tree is walked: each one
 * not walked by then (a link out of the tree) is walked now, in the order
 * found; the ones it links to in turn join the queue. */
static ms_status walk_linked(ms_batch_list *l, bool recursive)
{
    ms_status st = MS_OK;
    for (int i = 0; i < l->n_linked && st == MS_OK; i++) {
        struct ms_batch_link k = l->linked[i]; /* add_dir may move l->linked */
        struct stat sb;
        if (stat(k.dir, &sb) == 0 && fio_id_set_find(&l->visited, sb.st_dev, sb.st_ino) < 0)
            st = add_dir(l, k.dir, k.rel, recursive, k.depth);
    }
    for (int i = 0; i < l->n_linked; i++) {
        free(l->linked[i].dir);
        free(l->linked[i].rel);
    }
    l->n_linked = 0;
    return st;
}

static ms_status add_spelled(ms_batch_list *l, const char *path, const char *rel_source,
                             bool recursive, bool must_exist)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (must_exist) return ms_error(MS_ERR_IO, "%s: %s", path, strerror(errno));
        return push_spelled(l, path, rel_source);
    }
    /* A folder named explicitly is read even when it is the skipped one (-o
     * = the input folder); the skip applies to folders found by -r. */
    if (S_ISDIR(sb.st_mode)) {
        MS_TRY(add_dir(l, path, "", recursive, 0));
        return walk_linked(l, recursive);
    }
    return push_spelled(l, path, rel_source);
}

ms_status batch_place_loose(ms_batch_list *l)
{
    char **canon = calloc((size_t)(l->n ? l->n : 1), sizeof *canon);
    MS_CHECK_ALLOC(canon, (size_t)l->n * sizeof *canon);
    /* the deepest folder holding every loose file */
    size_t common = 0;
    const char *first = NULL;
    for (int i = 0; i < l->n; i++) {
        if (!l->items[i].loose || !(canon[i] = realpath(l->items[i].path, NULL))) continue;
        const char *c = canon[i];
        if (!first) {
            first = c;
            common = (size_t)(strrchr(c, '/') - c); /* realpath: absolute, has a '/' */
            continue;
        }
        size_t k = 0;
        while (k < common && c[k] == first[k]) k++;
        if (k == common && c[k] == '/') continue; /* inside the current folder */
        /* back to the last '/' before the first difference: a folder both share
         * (first[0] is '/', so this ends at worst at the root) */
        do k--; while (k > 0 && first[k] != '/');
        common = k;
    }
    ms_status st = MS_OK;
    for (int i = 0; i < l->n; i++) {
        if (!canon[i]) continue;
        char *rel = str_dup(canon[i] + common + 1);
        if (!rel) {
            st = ms_error(MS_ERR_OOM, "out of memory: output names");
            break;
        }
        free(l->items[i].rel);
        l->items[i].rel = rel;
        l->items[i].loose = false;
    }
    for (int i = 0; i < l->n; i++) free(canon[i]);
    free(canon);
    return st;
}

ms_status batch_add_path(ms_batch_list *l, const char *path, bool recursive)
{
    if (!*path) return ms_error(MS_ERR_ARG, "empty input path");
    /* A file given on the command line keeps only its base name under -o, as
     * `cp a/b.jpg DIR` would; folders mirror what is below them. */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return list_push(l, str_dup(path), str_dup(base_name(path)));
    return add_spelled(l, path, path, recursive, true);
}

ms_status batch_add_stream(ms_batch_list *l, FILE *f, const char *name, const char *base_dir,
                           bool recursive)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    ms_status st = MS_OK;
    while (st == MS_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            /* reported, and the lines after it still read */
            st = add_bad(l, "%s:%ld: NUL byte in a path (the line starts '%s')", name, lineno, line);
            continue;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' ||
                           line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || *p == '#') continue;
        char *full = (p[0] == '/' || !base_dir || !*base_dir) ? str_dup(p) : path_join(base_dir, p);
        if (!full) { st = ms_error(MS_ERR_OOM, "out of memory: reading %s", name); break; }
        st = add_spelled(l, full, p, recursive, false);
        free(full);
    }
    if (st == MS_OK && ferror(f)) st = ms_error(MS_ERR_IO, "%s: read error", name);
    free(line);
    return st;
}

ms_status batch_add_list_file(ms_batch_list *l, const char *list_path, bool recursive)
{
    FILE *f;
    MS_TRY(fio_fopen_list(&f, list_path));
    char *dir = str_dup(list_path);
    if (!dir) { fclose(f); return ms_error(MS_ERR_OOM, "out of memory"); }
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir ? 1 : 0] = '\0';
    else dir[0] = '\0';
    ms_status st = batch_add_stream(l, f, list_path, dir, recursive);
    free(dir);
    fclose(f);
    return st;
}

/* Path, then rel, so which spelling of a repeated path survives does not
 * depend on qsort's order. */
static int cmp_item(const void *a, const void *b)
{
    const ms_batch_item *x = a, *y = b;
    int c = strcmp(x->path, y->path);
    return c ? c : strcmp(x->rel, y->rel);
}

void batch_sort_unique(ms_batch_list *l)
{
    if (l->n == 0) return;
    qsort(l->items, (size_t)l->n, sizeof *l->items, cmp_item);
    int o = 1;
    for (int i = 1; i < l->n; i++) {
        if (!strcmp(l->items[i].path, l->items[o - 1].path)) {
            free(l->items[i].path);
            free(l->items[i].rel);
        } else {
            l->items[o++] = l->items[i];
        }
    }
    l->n = o;
}

ms_status batch_parse_shard(int *index, int *count, const char *s)
{
    char *end;
    errno = 0;
    long i = strtol(s, &end, 10);
    if (errno || end == s || *end != '/')
        return ms_error(MS_ERR_ARG, "--shard: expected I/N (e.g. 2/8), got '%s'", s);
    const char *ns = end + 1;
    long n = strtol(ns, &end, 10);
    if (errno || end == ns || *end)
        return ms_error(MS_ERR_ARG, "--shard: expected I/N (e.g. 2/8), got '%s'", s);
    if (n < 1 || n > 1000000 || i < 1 || i > n)
        return ms_error(MS_ERR_ARG, "--shard: need 1 <= I <= N (1-based), got '%s'", s);
    *index = (int)i;
    *count = (int)n;
    return MS_OK;
}

void batch_shard(ms_batch_list *l, int index, int count)
{
    int o = 0;
    for (int p = 0; p < l->n; p++) {
        if (batch_in_shard(p, index, count)) {
            l->items[o++] = l->items[p];
        } else {
            free(l->items[p].path);
            free(l->items[p].rel);
        }
    }
    l->n = o;
}

ms_status batch_output_path(char **out, const char *out_dir, const char *rel, const char *suffix)
{
    const char *base = base_name(rel);
    const char *dot = strrchr(base, '.');
    size_t stem = dot && dot != base ? (size_t)(dot - rel) : strlen(rel);
    size_t ld = strlen(out_dir), ls = strlen(suffix);
    char *p = malloc(ld + 1 + stem + ls + 1);
    MS_CHECK_ALLOC(p, ld + stem + ls + 2);
    size_t o = 0;
    if (ld) {
        memcpy(p, out_dir, ld);
        o = ld;
        if (out_dir[ld - 1] != '/') p[o++] = '/';
    }
    memcpy(p + o, rel, stem);
    o += stem;
    memcpy(p + o, suffix, ls + 1);
    *out = p;
    return MS_OK;
}

ms_status batch_note_inputs(const ms_batch_list *l)
{
    for (int i = 0; i < l->n; i++) {
        const ms_batch_item *it = &l->items[i];
        if (!it->exists) continue;
        struct stat sb = {.st_dev = it->dev, .st_ino = it->ino};
        MS_TRY(fio_note_input(it->path, &sb));
    }
    return MS_OK;
}

typedef struct {
    const char *s;
    int i;
} idx_str;

static int cmp_idx_str(const void *a, const void *b)
{
    const idx_str *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

ms_status batch_find_collisions(int *dup, char *const *outputs, int n)
{
    idx_str *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    MS_CHECK_ALLOC(v, (size_t)n * sizeof *v);
    for (int i = 0; i < n; i++) {
        v[i].s = outputs[i];
        v[i].i = i;
        dup[i] = -1;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_idx_str);
    /* After sorting, equal names are adjacent with the lowest index first. */
    for (int i = 1; i < n; i++) {
        int j = i - 1;
        if (!strcmp(v[i].s, v[j].s)) {
            int first = dup[v[j].i] >= 0 ? dup[v[j].i] : v[j].i;
            dup[v[i].i] = first;
        }
    }
    free(v);
    return MS_OK;
}

bool batch_output_done(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0;
}

ms_status batch_make_parent_dirs(const char *path)
{
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    MS_CHECK_ALLOC(p, n + 1);
    memcpy(p, path, n + 1);
    char *last = strrchr(p, '/');
    if (!last || last == p) { free(p); return MS_OK; }
    *last = '\0';
    for (char *s = p + 1; ; s++) {
        bool end = *s == '\0';
        if (*s == '/' || end) {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                ms_status st = ms_error(MS_ERR_IO, "%s: cannot create folder: %s", p, strerror(errno));
                free(p);
                return st;
            }
            struct stat sb;
            if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
                ms_status st = ms_error(MS_ERR_IO, "%s: exists and is not a folder", p);
                free(p);
                return st;
            }
            *s = c;
        }
        if (end) break;
    }
    free(p);
    return MS_OK;
}

/* Windows per pixel a tiling may average; overlap 3/4 of the tile gives 16. */
#define MS_TILE_MAX_RUNS 16

int batch_tile_starts(int *starts, int len, int tile, int overlap)
{
    /* Windows at 0, stride, 2*stride, ... until one reaches the end; the last
     * is moved back to end flush, so no window is partial and none hangs out
     * (the same windows as a model's input.slide, mmseg's slide_inference). */
    int stride = tile - overlap, count = slide_windows(len, tile, stride);
    if (starts)
        for (int i = 0; i < count; i++) starts[i] = slide_start(i, len, tile, stride);
    return count;
}

ms_status batch_run_tiled(uint8_t *mask, float *logits, const uint8_t *rgb, int w, int h,
                          int classes, int tile, int overlap, batch_run_fn run, void *ctx)
{
    if (tile < 1 || overlap < 0 || overlap >= tile)
        return ms_error(MS_ERR_ARG, "--tile %d --overlap %d: need 0 <= overlap < tile", tile,
                        overlap);
    if (w < 1 || h < 1 || classes < 1)
        return ms_error(MS_ERR_ARG, "tiling an empty image or model (%dx%d, %d classes)", w, h,
                        classes);
    int ny = batch_tile_starts(NULL, h, tile, overlap);
    int nx = batch_tile_starts(NULL, w, tile, overlap);
    size_t plane = (size_t)w * h, total;
    /* Work absurd for the image's size (a 16-pixel tile with overlap 15 runs
     * each pixel 256 times) is refused up front rather than ground through. */
    double runs = (double)nx * ny * (w < tile ? w : tile) * (h < tile ? h : tile) / (double)plane;
    if (runs > MS_TILE_MAX_RUNS)
        return ms_error(MS_ERR_ARG,
                        "--tile %d --overlap %d would run each pixel %.0f times (at most %d): "
                        "use a smaller overlap", tile, overlap, runs, MS_TILE_MAX_RUNS);
    if (!ms_mul_size(&total, plane, (size_t)classes))
        return ms_error(MS_ERR_ARG, "tiling: %dx%d x %d classes overflows", w, h, classes);
    int *ys = malloc((size_t)ny * sizeof *ys), *xs = malloc((size_t)nx * sizeof *xs);
    float *acc = logits ? logits : ms_calloc(total, sizeof(float)); /* (classes, h, w) */
    uint32_t *cnt = ms_calloc(plane, sizeof *cnt);                   /* (h, w) windows per pixel */
    int tw = w < tile ? w : tile, th = h < tile ? h : tile;
    uint8_t *crop = ms_malloc((size_t)tw * th * 3); /* (th, tw, 3) */
    ms_status st = MS_OK;
    if (!ys || !xs || !acc || !cnt || !crop) {
        st = ms_error(MS_ERR_OOM, "out of memory: tiling a %dx%d image with %d classes", w, h,
                      classes);
        goto done;
    }
    if (logits) memset(acc, 0, total * sizeof(float));
    batch_tile_starts(ys, h, tile, overlap);
    batch_tile_starts(xs, w, tile, overlap);
    for (int ty = 0; ty < ny && st == MS_OK; ty++) {
        for (int tx = 0; tx < nx && st == MS_OK; tx++) {
            int y0 = ys[ty], x0 = xs[tx];
            for (int y = 0; y < th; y++)
                memcpy(crop + (size_t)y * tw * 3, rgb + ((size_t)(y0 + y) * w + x0) * 3,
                       (size_t)tw * 3);
            const float *cl = NULL; /* (classes, th, tw) */
            st = run(ctx, &cl, crop, tw, th);
            if (st != MS_OK) break;
            for (int c = 0; c < classes; c++)
                for (int y = 0; y < th; y++) {
                    float *dst = acc + (size_t)c * plane + (size_t)(y0 + y) * w + x0;
                    const float *src = cl + ((size_t)c * th + y) * tw;
                    for (int x = 0; x < tw; x++) dst[x] += src[x];
                }
            for (int y = 0; y < th; y++)
                for (int x = 0; x < tw; x++) cnt[(size_t)(y0 + y) * w + x0 + x]++;
        }
    }
    if (st == MS_OK) {
        /* Every pixel is covered at least once: the windows' union is the image. */
        for (size_t p = 0; p < plane; p++) {
            float inv = 1.0f / (float)cnt[p];
            int best = 0;
            float bv = acc[p] * inv;
            acc[p] = bv;
            for (int c = 1; c < classes; c++) {
                float v = acc[(size_t)c * plane + p] * inv;
                acc[(size_t)c * plane + p] = v;
                if (v > bv) { bv = v; best = c; }
            }
            mask[p] = (uint8_t)best;
        }
    }
done:
    free(ys);
    free(xs);
    if (acc != logits) ms_free(acc);
    ms_free(cnt);
    ms_free(crop);
    return st;
}

void batch_colorize(uint8_t *rgb, const uint8_t *mask, size_t n, const uint8_t (*palette)[3],
                    int n_palette)
{
    for (size_t p = 0; p < n; p++) {
        int c = mask[p];
        if (c < n_palette) {
            rgb[3 * p] = palette[c][0];
            rgb[3 * p + 1] = palette[c][1];
            rgb[3 * p + 2] = palette[c][2];
        } else {
            rgb[3 * p] = rgb[3 * p + 1] = rgb[3 * p + 2] = 0;
        }
    }
}

void batch_blend(uint8_t *out, const uint8_t *img, const uint8_t *mask, size_t n,
                 const uint8_t (*palette)[3], int n_palette)
{
    static const uint8_t black[3] = {0, 0, 0};
    for (size_t p = 0; p < n; p++) {
        const uint8_t *col = mask[p] < n_palette ? palette[mask[p]] : black;
        for (int k = 0; k < 3; k++)
            out[3 * p + k] = (uint8_t)((img[3 * p + k] + col[k] + 1) / 2);
    }
}

typedef struct {
    ms_engine *e;
    ms_result *res;
    const ms_run_options *opt;
} tile_ctx;

static ms_status run_crop(void *vctx, const float **logits, const uint8_t *crop, int cw, int ch)
{
    tile_ctx *c = vctx;
    ms_image img = {.w = cw, .h = ch, .rgb = (uint8_t *)crop}; /* engine_run only reads it */
    MS_TRY(engine_run(c->e, c->res, &img, c->opt));
    *logits = c->res->logits;
    return MS_OK;
}

ms_status batch_segment_tiled(uint8_t *mask, ms_engine *e, ms_result *res,
                              const ms_run_options *opt, const ms_image *img, int tile,
                              int overlap)
{
    ms_run_options with_logits = *opt;
    with_logits.mask_only = false; /* the windows' logits are summed */
    tile_ctx c = {e, res, &with_logits};
    return batch_run_tiled(mask, NULL, img->rgb, img->w, img->h, engine_config(e)->n_classes,
                           tile, overlap, run_crop, &c);
}
