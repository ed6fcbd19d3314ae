/* safetensors reading (read into memory, everything validated before any
 * tensor byte is used) and writing (temp file + fsync + rename). */
#include "model_file.h"
#include "file_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

#define MS_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* model-format.md: 100 MB */
/* JSON numbers are doubles; above 2^53 integers are no longer exact. */
#define MS_MAX_JSON_INT 9007199254740992.0

struct ms_model_file {
    char *path;
    uint8_t *bytes;    /* the whole file, read */
    size_t size;
    ms_config cfg;
    bool has_cfg;      /* a model (model_file_open), not a plain safetensors file */
    char **meta;       /* __metadata__ as key, value, key, value, ... (owned) */
    int n_meta;        /* pairs */
    int n;
    ms_tensor *t;      /* sorted by name */
    char *names;       /* one block holding every t[i].name */
};

static const char *const dtype_names[MS_DT_COUNT] = {"F32", "F16", "BF16", "I32", "U8",
                                                     "F64", "I64", "I16", "I8", "U16",
                                                     "U32", "U64", "BOOL"};
static const size_t dtype_sizes[MS_DT_COUNT] = {4, 2, 2, 4, 1, 8, 8, 2, 1, 2, 4, 8, 1};

static int dtype_from_name(const char *s)
{
    for (int i = 0; i < MS_DT_COUNT; i++)
        if (strcmp(s, dtype_names[i]) == 0) return i;
    return -1;
}

/* "(96, 33)" into buf. */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "(");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, ")");
    return buf;
}

/* A non-negative integer that a double represents exactly. */
static bool json_uint(uint64_t *out, const cJSON *v)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MS_MAX_JSON_INT) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const ms_tensor *)a)->name, ((const ms_tensor *)b)->name);
}

typedef struct {
    uint64_t begin, end;
    const char *name;
} range;

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* One tensor entry of the header. data_size: bytes after the header. */
static ms_status parse_entry(ms_tensor *t, range *r, const cJSON *e, const uint8_t *data, uint64_t data_size)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return ms_error(MS_ERR_FORMAT, "tensor %s: entry is not an object", name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return ms_error(MS_ERR_FORMAT, "tensor %s: missing dtype", name);
    int d = dtype_from_name(dt->valuestring);
    if (d < 0) return ms_error(MS_ERR_FORMAT, "tensor %s: unsupported dtype '%.16s'", name, dt->valuestring);
    t->dtype = (ms_dtype)d;

    if (!cJSON_IsArray(sh)) return ms_error(MS_ERR_FORMAT, "tensor %s: missing shape", name);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > MS_MAX_DIMS)
        return ms_error(MS_ERR_FORMAT, "tensor %s: %d dimensions, at most %d supported", name, ndim, MS_MAX_DIMS);
    t->ndim = ndim;
    size_t bytes = dtype_sizes[d];
    bool overflow = false;
    for (int i = 0; i < ndim; i++) {
        uint64_t v;
        if (!json_uint(&v, cJSON_GetArrayItem(sh, i)))
            return ms_error(MS_ERR_FORMAT, "tensor %s: shape[%d] is not a non-negative integer", name, i);
        t->shape[i] = (int64_t)v;
        if (!ms_mul_size(&bytes, bytes, (size_t)v)) overflow = true;
    }
    /* A zero dimension makes the product 0 whatever overflowed before it. */
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] == 0) overflow = false, bytes = 0;

    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(&b, cJSON_GetArrayItem(off, 0)) ||
        !json_uint(&en, cJSON_GetArrayItem(off, 1)))
        return ms_error(MS_ERR_FORMAT, "tensor %s: data_offsets must be [begin, end]", name);
    if (b > en) return ms_error(MS_ERR_FORMAT, "tensor %s: data_offsets [%llu, %llu] end before begin", name,
                                (unsigned long long)b, (unsigned long long)en);
    if (en > data_size)
        return ms_error(MS_ERR_FORMAT, "tensor %s: data_offsets [%llu, %llu] outside the data region (%llu bytes)",
                        name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
    char sbuf[256];
    if (overflow)
        return ms_error(MS_ERR_FORMAT, "tensor %s: %s x %s overflows the address space", name, dtype_names[d],
                        shape_str(sbuf, sizeof sbuf, ndim, t->shape));
    if ((uint64_t)bytes != en - b)
        return ms_error(MS_ERR_FORMAT, "tensor %s: %s x %s is %zu bytes but data_offsets [%llu, %llu] hold %llu",
                        name, dtype_names[d], shape_str(sbuf, sizeof sbuf, ndim, t->shape), bytes,
                        (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b));
    t->nbytes = (size_t)(en - b);
    t->data = data + b;
    r->begin = b;
    r->end = en;
    r->name = name;
    return MS_OK;
}

/* Copies __metadata__ (string to string, as safetensors requires). */
static ms_status copy_metadata(ms_model_file *mf, const cJSON *meta)
{
    if (!meta) return MS_OK;
    if (!cJSON_IsObject(meta)) return ms_error(MS_ERR_FORMAT, "__metadata__ is not an object");
    int n = cJSON_GetArraySize(meta);
    mf->meta = calloc((size_t)n * 2 + 1, sizeof *mf->meta);
    MS_CHECK_ALLOC(mf->meta, ((size_t)n * 2 + 1) * sizeof *mf->meta);
    const cJSON *e;
    cJSON_ArrayForEach(e, meta)
    {
        if (!cJSON_IsString(e))
            return ms_error(MS_ERR_FORMAT, "__metadata__ value for %s is not a string", e->string);
        char **kv = &mf->meta[2 * mf->n_meta];
        kv[0] = strdup(e->string);
        kv[1] = strdup(e->valuestring);
        mf->n_meta++; /* counted before the check so close frees both */
        if (!kv[0] || !kv[1]) return ms_error(MS_ERR_OOM, "out of memory copying __metadata__");
    }
    return MS_OK;
}

static ms_status parse_metadata(ms_config *cfg, const cJSON *meta)
{
    if (!meta) return ms_error(MS_ERR_FORMAT, "no __metadata__ (not a mitaseg model file)");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(meta, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(meta, "format_version");
    const cJSON *conf = cJSON_GetObjectItemCaseSensitive(meta, "config");
    if (!cJSON_IsString(fmt)) return ms_error(MS_ERR_FORMAT, "__metadata__ has no format (not a mitaseg model file)");
    if (strcmp(fmt->valuestring, "mitaseg") != 0)
        return ms_error(MS_ERR_FORMAT, "__metadata__ format is '%.64s', expected 'mitaseg'", fmt->valuestring);
    if (!cJSON_IsString(ver)) return ms_error(MS_ERR_FORMAT, "__metadata__ has no format_version");
    if (strcmp(ver->valuestring, "1") != 0)
        return ms_error(MS_ERR_FORMAT, "unsupported format_version '%.64s' (this build reads 1)", ver->valuestring);
    if (!cJSON_IsString(conf)) return ms_error(MS_ERR_FORMAT, "__metadata__ has no config");
    return config_parse(cfg, conf->valuestring);
}

/* Everything after the mapping exists: header, entries, ranges, config. */
static ms_status parse_header(ms_model_file *mf, bool model)
{
    if (mf->size < 8)
        return ms_error(MS_ERR_FORMAT, "file too small (%zu bytes) for a safetensors header", mf->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | mf->bytes[i];
    if (hlen > MS_MAX_HEADER)
        return ms_error(MS_ERR_FORMAT, "header length %llu over the 100 MB limit", (unsigned long long)hlen);
    if (hlen > mf->size - 8)
        return ms_error(MS_ERR_FORMAT, "header length %llu past end of file (%zu bytes)", (unsigned long long)hlen,
                        mf->size);
    const uint8_t *data = mf->bytes + 8 + hlen;
    uint64_t data_size = mf->size - 8 - hlen;

    cJSON *root = cJSON_ParseWithLength((const char *)mf->bytes + 8, (size_t)hlen);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        const char *h = (const char *)mf->bytes + 8;
        long off = (at && at >= h && at <= h + hlen) ? (long)(at - h) : -1;
        return ms_error(MS_ERR_FORMAT, "header JSON does not parse (near byte %ld of %llu)", off,
                        (unsigned long long)hlen);
    }
    ms_status st = MS_OK;
    range *ranges = NULL;
    if (!cJSON_IsObject(root)) {
        st = ms_error(MS_ERR_FORMAT, "header is not a JSON object");
        goto done;
    }
    const cJSON *e, *meta = NULL;
    int n = 0;
    size_t names_len = 0;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (meta) {
                st = ms_error(MS_ERR_FORMAT, "header has two __metadata__ entries");
                goto done;
            }
            meta = e;
        } else {
            n++;
            names_len += strlen(e->string) + 1;
        }
    }
    mf->t = calloc((size_t)n + 1, sizeof *mf->t);
    ranges = calloc((size_t)n + 1, sizeof *ranges);
    mf->names = malloc(names_len + 1);
    char *names = mf->names;
    if (!mf->t || !ranges || !names) {
        st = ms_error(MS_ERR_OOM, "out of memory for %d tensor entries", n);
        goto done;
    }
    size_t no = 0;
    int i = 0;
    cJSON_ArrayForEach(e, root)
    {
        if (e == meta) continue;
        st = parse_entry(&mf->t[i], &ranges[i], e, data, data_size);
        if (st != MS_OK) goto done;
        size_t len = strlen(e->string) + 1;
        memcpy(names + no, e->string, len);
        mf->t[i].name = names + no;
        ranges[i].name = mf->t[i].name;
        no += len;
        i++;
    }
    mf->n = n;

    /* Ranges may not overlap; empty tensors occupy no bytes and may sit
     * anywhere in the region. */
    qsort(ranges, (size_t)n, sizeof *ranges, cmp_range);
    const range *prev = NULL;
    for (i = 0; i < n; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (prev && ranges[i].begin < prev->end) {
            st = ms_error(MS_ERR_FORMAT, "tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", prev->name,
                          (unsigned long long)prev->begin, (unsigned long long)prev->end, ranges[i].name,
                          (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end);
            goto done;
        }
        prev = &ranges[i];
    }
    qsort(mf->t, (size_t)n, sizeof *mf->t, cmp_tensor_name);
    for (i = 1; i < n; i++) {
        if (strcmp(mf->t[i - 1].name, mf->t[i].name) == 0) {
            st = ms_error(MS_ERR_FORMAT, "tensor %s appears twice", mf->t[i].name);
            goto done;
        }
    }
    st = copy_metadata(mf, meta);
    if (st == MS_OK && model) {
        st = parse_metadata(&mf->cfg, meta);
        mf->has_cfg = st == MS_OK;
    }

done:
    free(ranges);
    cJSON_Delete(root);
    return st;
}

static bool same_file_state(const struct stat *a, const struct stat *b)
{
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ino == b->st_ino;
}

/* Reads exactly n bytes; the file must still have the size and mtime it had
 * when opened (sb), else another process changed it while it was read. */
static ms_status read_whole(uint8_t *dst, size_t n, int fd, const char *path, const struct stat *sb)
{
    size_t got = 0;
    while (got < n) {
        size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
        ssize_t r = pread(fd, dst + got, want, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ms_error(MS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return ms_error(MS_ERR_IO, "%s: the file changed while being read (%zu of %zu bytes there)", path,
                            got, n);
        got += (size_t)r;
    }
    struct stat now;
    if (fstat(fd, &now) != 0) return ms_error(MS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!same_file_state(sb, &now))
        return ms_error(MS_ERR_IO, "%s: the file changed while being read (size or time differs)", path);
    return MS_OK;
}

static ms_status open_file(ms_model_file **out, const char *path, bool model)
{
    *out = NULL;
    ms_model_file *mf = calloc(1, sizeof *mf);
    MS_CHECK_ALLOC(mf, sizeof *mf);
    mf->path = strdup(path);
    if (!mf->path) {
        free(mf);
        return ms_error(MS_ERR_OOM, "out of memory");
    }
    ms_status st = MS_OK;
    /* Regular files only, opened without blocking (a FIFO is refused, not
     * waited on), and remembered so no output replaces the model. */
    int fd;
    struct stat sb;
    st = fio_open_input(&fd, path, &sb);
    if (st != MS_OK) goto fail;
    /* Read, not mmap: a file that shrinks under a mapping kills the reader
     * with SIGBUS; a short read or a changed size/mtime is an error. */
    mf->size = (size_t)sb.st_size;
    if ((off_t)mf->size != sb.st_size) {
        st = ms_error(MS_ERR_IO, "%s: too large to read (%lld bytes)", path, (long long)sb.st_size);
        close(fd);
        goto fail;
    }
    mf->bytes = malloc(mf->size ? mf->size : 1);
    if (!mf->bytes) {
        st = ms_error(MS_ERR_OOM, "%s: out of memory reading %zu bytes", path, mf->size);
        close(fd);
        goto fail;
    }
    st = read_whole(mf->bytes, mf->size, fd, path, &sb);
    close(fd);
    if (st != MS_OK) goto fail;
    st = parse_header(mf, model);
    if (st != MS_OK) {
        ms_error_prefix(st, "%s", path);
        goto fail;
    }
    *out = mf;
    return MS_OK;
fail:
    model_file_close(mf);
    return st;
}

ms_status model_file_open(ms_model_file **out, const char *path) { return open_file(out, path, true); }
ms_status safetensors_open(ms_model_file **out, const char *path) { return open_file(out, path, false); }

void model_file_close(ms_model_file *mf)
{
    if (!mf) return;
    for (int i = 0; i < 2 * mf->n_meta; i++) free(mf->meta[i]);
    free(mf->meta);
    free(mf->bytes);
    config_free(&mf->cfg);
    free(mf->names);
    free(mf->t);
    free(mf->path);
    free(mf);
}

const char *model_file_path(const ms_model_file *mf) { return mf->path; }
const ms_config *model_file_config(const ms_model_file *mf) { return mf->has_cfg ? &mf->cfg : NULL; }

const char *model_file_metadata(const ms_model_file *mf, const char *key)
{
    for (int i = 0; i < mf->n_meta; i++)
        if (strcmp(mf->meta[2 * i], key) == 0) return mf->meta[2 * i + 1];
    return NULL;
}
int model_file_count(const ms_model_file *mf) { return mf->n; }
const ms_tensor *model_file_tensor(const ms_model_file *mf, int i)
{
    return (i >= 0 && i < mf->n) ? &mf->t[i] : NULL;
}

const ms_tensor *model_file_find(const ms_model_file *mf, const char *name)
{
    ms_tensor key = {.name = name};
    return mf->n ? bsearch(&key, mf->t, (size_t)mf->n, sizeof *mf->t, cmp_tensor_name) : NULL;
}

/* IEEE half to float, exact for every half including subnormals, inf, nan. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf, or nan keeping its payload */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13); /* rebias 15 -> 127 */
    } else if (mant == 0) {
        bits = sign; /* signed zero */
    } else {
        /* Subnormal: mant * 2^-24, normalised for float. */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

ms_status model_file_check_f32(const ms_model_file *mf, const char *name, int ndim, const int64_t *shape)
{
    const ms_tensor *t = model_file_find(mf, name);
    char want[256], got[256];
    if (!t) return ms_error(MS_ERR_FORMAT, "%s: missing tensor %s", mf->path, name);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return ms_error(MS_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", mf->path, name,
                        shape_str(got, sizeof got, t->ndim, t->shape), shape_str(want, sizeof want, ndim, shape));
    if (t->dtype != MS_DT_F32 && t->dtype != MS_DT_F16 && t->dtype != MS_DT_BF16 && t->dtype != MS_DT_F64)
        return ms_error(MS_ERR_FORMAT, "%s: tensor %s has dtype %s, expected F32, F16, BF16 or F64", mf->path,
                        name, dtype_names[t->dtype]);
    return MS_OK;
}

ms_status model_file_read_f32(const ms_model_file *mf, const char *name, float *dst, int ndim,
                              const int64_t *shape)
{
    MS_TRY(model_file_check_f32(mf, name, ndim, shape));
    const ms_tensor *t = model_file_find(mf, name);
    size_t n = t->nbytes / dtype_sizes[t->dtype];
    if (n == 0) return MS_OK; /* dst may be NULL for an empty tensor */
    /* The data may be unaligned (any header length is legal), so copy bytes. */
    const uint8_t *src = t->data;
    switch (t->dtype) {
    case MS_DT_F32:
        memcpy(dst, src, n * 4);
        break;
    case MS_DT_F16:
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    case MS_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &bits, 4);
        }
        break;
    case MS_DT_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, src + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    default:
        break; /* excluded above */
    }
    return MS_OK;
}

/* ---- writing ---- */

static bool write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* The header JSON, padded with spaces to a multiple of 8 so the data region
 * starts 8-byte aligned in the file. */
static ms_status build_header(char **out, size_t *out_len, const char *path, const ms_tensor *tensors, int n,
                              const char *const *metadata)
{
    cJSON *root = cJSON_CreateObject();
    MS_CHECK_ALLOC(root, sizeof(cJSON));
    ms_status st = MS_OK;
    bool oom = false;
    if (metadata && metadata[0]) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        oom |= !meta;
        for (int i = 0; meta && metadata[i]; i += 2) {
            if (!metadata[i + 1]) {
                st = ms_error(MS_ERR_ARG, "%s: metadata key %s has no value", path, metadata[i]);
                goto done;
            }
            oom |= !cJSON_AddStringToObject(meta, metadata[i], metadata[i + 1]);
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < n && !oom; i++) {
        const ms_tensor *t = &tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        oom |= !e || !shape || !offs || !cJSON_AddStringToObject(e, "dtype", dtype_names[t->dtype]);
        for (int k = 0; k < t->ndim && shape; k++) {
            cJSON *num = cJSON_CreateNumber((double)t->shape[k]);
            oom |= !num || !cJSON_AddItemToArray(shape, num);
        }
        cJSON *b = cJSON_CreateNumber((double)off), *en = cJSON_CreateNumber((double)(off + t->nbytes));
        oom |= !b || !en || !offs || !cJSON_AddItemToArray(offs, b) || !cJSON_AddItemToArray(offs, en);
        off += t->nbytes;
    }
    if (oom) {
        st = ms_error(MS_ERR_OOM, "%s: out of memory building the header", path);
        goto done;
    }
    char *s = cJSON_PrintUnformatted(root);
    if (!s) {
        st = ms_error(MS_ERR_OOM, "%s: out of memory printing the header", path);
        goto done;
    }
    size_t len = strlen(s), padded = (len + 7) & ~(size_t)7;
    char *h = realloc(s, padded + 1);
    if (!h) {
        free(s);
        st = ms_error(MS_ERR_OOM, "%s: out of memory printing the header", path);
        goto done;
    }
    memset(h + len, ' ', padded - len);
    h[padded] = '\0';
    *out = h;
    *out_len = padded;
done:
    cJSON_Delete(root);
    return st;
}

static ms_status check_tensors(const char *path, const ms_tensor *tensors, int n)
{
    if (n < 0 || (n > 0 && !tensors)) return ms_error(MS_ERR_ARG, "%s: bad tensor list", path);
    for (int i = 0; i < n; i++) {
        const ms_tensor *t = &tensors[i];
        if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0)
            return ms_error(MS_ERR_ARG, "%s: tensor %d has no usable name", path, i);
        if ((int)t->dtype < 0 || (int)t->dtype >= MS_DT_COUNT || t->ndim < 0 || t->ndim > MS_MAX_DIMS)
            return ms_error(MS_ERR_ARG, "%s: tensor %s: bad dtype or ndim", path, t->name);
        size_t bytes = dtype_sizes[t->dtype];
        for (int k = 0; k < t->ndim; k++)
            if (t->shape[k] < 0 || !ms_mul_size(&bytes, bytes, (size_t)t->shape[k]))
                return ms_error(MS_ERR_ARG, "%s: tensor %s: bad shape", path, t->name);
        if (bytes != t->nbytes || (bytes && !t->data))
            return ms_error(MS_ERR_ARG, "%s: tensor %s: %zu bytes given, shape needs %zu", path, t->name, t->nbytes,
                            bytes);
        for (int j = 0; j < i; j++)
            if (strcmp(tensors[j].name, t->name) == 0)
                return ms_error(MS_ERR_ARG, "%s: tensor %s given twice", path, t->name);
    }
    return MS_OK;
}

/* Larger elements first (stable): with no gaps between tensors, every
 * tensor then starts aligned to its element size, as the safetensors
 * reference writer does, so readers can use the mapping in place. */
static int by_element_size_desc(const void *a, const void *b)
{
    const ms_tensor *x = *(const ms_tensor *const *)a, *y = *(const ms_tensor *const *)b;
    size_t sx = dtype_sizes[x->dtype], sy = dtype_sizes[y->dtype];
    if (sx != sy) return sx < sy ? 1 : -1;
    return x < y ? -1 : x > y;
}

ms_status safetensors_write(const char *path, const ms_tensor *given, int n, const char *const *metadata)
{
    MS_TRY(check_tensors(path, given, n));
    const ms_tensor **order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    ms_tensor *tensors = malloc((size_t)(n > 0 ? n : 1) * sizeof *tensors);
    if (!order || !tensors) {
        free(order), free(tensors);
        return ms_error(MS_ERR_OOM, "%s: out of memory", path);
    }
    for (int i = 0; i < n; i++) order[i] = &given[i];
    qsort(order, (size_t)n, sizeof *order, by_element_size_desc);
    for (int i = 0; i < n; i++) tensors[i] = *order[i];
    free(order);
    ms_status hst = MS_OK;
    char *header = NULL;
    size_t hlen = 0;
    hst = build_header(&header, &hlen, path, tensors, n, metadata);
    if (hst != MS_OK) {
        free(tensors);
        return hst;
    }

    fio_atomic af;
    hst = fio_atomic_begin(&af, path);
    if (hst != MS_OK) {
        free(header);
        free(tensors);
        return hst;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int fd = fileno(af.f); /* nothing buffered in af.f: plain writes */
    bool ok = write_all(fd, len8, 8) && write_all(fd, header, hlen);
    for (int i = 0; ok && i < n; i++) ok = write_all(fd, tensors[i].data, tensors[i].nbytes);
    int err = ok ? 0 : errno;
    free(header);
    free(tensors);
    if (!ok) {
        fio_atomic_abort(&af);
        return ms_error(MS_ERR_IO, "%s: write failed: %s", path, strerror(err));
    }
    return fio_atomic_commit(&af);
}
