/* Confusion matrix and mIoU/mAcc/aAcc. */
#include "eval.h"
#include "file_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ms_status confusion_init(ms_confusion *c, int n_classes, int ignore_index)
{
    memset(c, 0, sizeof *c);
    if (n_classes < 1 || n_classes > 256)
        return ms_error(MS_ERR_ARG, "confusion matrix: %d classes (need 1..256)", n_classes);
    c->cm = calloc((size_t)n_classes * n_classes, sizeof *c->cm);
    MS_CHECK_ALLOC(c->cm, (size_t)n_classes * n_classes * sizeof *c->cm);
    c->n_classes = n_classes;
    c->ignore_index = ignore_index;
    return MS_OK;
}

void confusion_free(ms_confusion *c)
{
    free(c->cm);
    memset(c, 0, sizeof *c);
}

void confusion_clear(ms_confusion *c)
{
    memset(c->cm, 0, (size_t)c->n_classes * c->n_classes * sizeof *c->cm);
    c->ignored = c->out_of_range = c->bad_pred = 0;
    c->images = 0;
}

void confusion_merge(ms_confusion *dst, const ms_confusion *src)
{
    size_t n = (size_t)src->n_classes * src->n_classes;
    for (size_t i = 0; i < n; i++) dst->cm[i] += src->cm[i];
    dst->ignored += src->ignored;
    dst->out_of_range += src->out_of_range;
    dst->bad_pred += src->bad_pred;
    dst->images += src->images;
}

void confusion_add(ms_confusion *c, const uint8_t *label, const uint8_t *pred, size_t n)
{
    const int nc = c->n_classes;
    for (size_t p = 0; p < n; p++) {
        int l = label[p], q = pred[p];
        if (l == c->ignore_index) { c->ignored++; continue; }
        if (l >= nc) { c->out_of_range++; continue; }
        if (q >= nc) { c->bad_pred++; continue; }
        c->cm[(size_t)l * nc + q]++;
    }
    c->images++;
}

ms_status metrics_compute(ms_metrics *m, const ms_confusion *c)
{
    memset(m, 0, sizeof *m);
    const int nc = c->n_classes;
    m->n_classes = nc;
    m->iou = malloc((size_t)nc * sizeof *m->iou);
    m->acc = malloc((size_t)nc * sizeof *m->acc);
    m->label_px = calloc((size_t)nc, sizeof *m->label_px);
    m->pred_px = calloc((size_t)nc, sizeof *m->pred_px);
    if (!m->iou || !m->acc || !m->label_px || !m->pred_px) {
        metrics_free(m);
        return ms_error(MS_ERR_OOM, "out of memory: metrics for %d classes", nc);
    }
    uint64_t correct = 0;
    for (int l = 0; l < nc; l++)
        for (int q = 0; q < nc; q++) {
            uint64_t v = c->cm[(size_t)l * nc + q];
            m->label_px[l] += v;
            m->pred_px[q] += v;
            m->labelled += v;
            if (l == q) correct += v;
        }
    double sum_iou = 0, sum_acc = 0;
    for (int k = 0; k < nc; k++) {
        uint64_t tp = c->cm[(size_t)k * nc + k];
        uint64_t uni = m->label_px[k] + m->pred_px[k] - tp;
        m->iou[k] = uni ? (double)tp / (double)uni : NAN;
        m->acc[k] = m->label_px[k] ? (double)tp / (double)m->label_px[k] : NAN;
        if (uni) { sum_iou += m->iou[k]; m->n_iou++; }
        if (m->label_px[k]) { sum_acc += m->acc[k]; m->n_acc++; }
    }
    m->aacc = m->labelled ? (double)correct / (double)m->labelled : NAN;
    m->miou = m->n_iou ? sum_iou / m->n_iou : NAN;
    m->macc = m->n_acc ? sum_acc / m->n_acc : NAN;
    return MS_OK;
}

void metrics_free(ms_metrics *m)
{
    free(m->iou);
    free(m->acc);
    free(m->label_px);
    free(m->pred_px);
    memset(m, 0, sizeof *m);
}

/* Percent rounded to 4 decimals (more than the table shows, no float noise);
 * null when undefined. */
static cJSON *pct(double v)
{
    if (isnan(v)) return cJSON_CreateNull();
    return cJSON_CreateNumber(round(v * 1e6) / 1e4);
}

static bool add_item(cJSON *obj, const char *key, cJSON *item)
{
    if (!item) return false;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return false;
    }
    return true;
}

/* Appends item to array; NULL (item freed) when either failed. */
static cJSON *append(cJSON *array, cJSON *item)
{
    if (item && cJSON_AddItemToArray(array, item)) return item;
    cJSON_Delete(item);
    return NULL;
}

ms_status metrics_to_json(char **out, const ms_metrics *m, const ms_confusion *c,
                          const char (*names)[64], const char *const *meta,
                          const ms_image_score *scores, int n_scores)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && meta)
        for (int i = 0; meta[i] && meta[i + 1] && ok; i += 2) {
            char *end;
            errno = 0;
            double v = strtod(meta[i + 1], &end);
            /* plain decimal only: "0x0" (a 0x0 grid) or "inf" stay strings */
            bool num = *meta[i + 1] && !*end && !errno && isfinite(v) &&
                       strspn(meta[i + 1], "0123456789+-.eE") == strlen(meta[i + 1]);
            ok = add_item(root, meta[i], num ? cJSON_CreateNumber(v) : cJSON_CreateString(meta[i + 1]));
        }
    ok = ok && add_item(root, "aAcc", pct(m->aacc));
    ok = ok && add_item(root, "mIoU", pct(m->miou));
    ok = ok && add_item(root, "mAcc", pct(m->macc));
    cJSON *classes = ok ? cJSON_CreateArray() : NULL;
    ok = ok && add_item(root, "classes", classes);
    for (int k = 0; ok && k < m->n_classes; k++) {
        cJSON *o = append(classes, cJSON_CreateObject());
        if (!(ok = o != NULL)) break;
        char fallback[32];
        snprintf(fallback, sizeof fallback, "class %d", k);
        ok = add_item(o, "name", cJSON_CreateString(names ? names[k] : fallback)) &&
             add_item(o, "IoU", pct(m->iou[k])) && add_item(o, "Acc", pct(m->acc[k])) &&
             add_item(o, "label_pixels", cJSON_CreateNumber((double)m->label_px[k])) &&
             add_item(o, "pred_pixels", cJSON_CreateNumber((double)m->pred_px[k]));
    }
    /* rows = label, columns = prediction, pixels (exact: counts stay far
     * below 2^53) */
    cJSON *conf = ok ? cJSON_CreateArray() : NULL;
    ok = ok && add_item(root, "confusion", conf);
    for (int l = 0; ok && l < c->n_classes; l++) {
        const uint64_t *cells = c->cm + (size_t)l * c->n_classes;
        cJSON *row = append(conf, cJSON_CreateArray());
        ok = row != NULL;
        for (int q = 0; ok && q < c->n_classes; q++)
            ok = append(row, cJSON_CreateNumber((double)cells[q])) != NULL;
    }
    cJSON *px = ok ? cJSON_CreateObject() : NULL;
    ok = ok && add_item(root, "pixels", px);
    ok = ok && add_item(px, "labelled", cJSON_CreateNumber((double)m->labelled)) &&
         add_item(px, "ignored", cJSON_CreateNumber((double)c->ignored)) &&
         add_item(px, "label_out_of_range", cJSON_CreateNumber((double)c->out_of_range));
    cJSON *per = ok && scores ? cJSON_CreateArray() : NULL;
    ok = ok && (!scores || add_item(root, "per_image", per));
    for (int i = 0; ok && scores && i < n_scores; i++) {
        cJSON *o = append(per, cJSON_CreateObject());
        ok = o && add_item(o, "image", cJSON_CreateString(scores[i].image)) &&
             add_item(o, "label", cJSON_CreateString(scores[i].label)) &&
             add_item(o, "mIoU", pct(scores[i].miou)) && add_item(o, "aAcc", pct(scores[i].aacc)) &&
             add_item(o, "labelled", cJSON_CreateNumber((double)scores[i].labelled));
    }
    char *s = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!s) return ms_error(MS_ERR_OOM, "out of memory: building the metrics JSON");
    *out = s;
    return MS_OK;
}

ms_status metrics_write_json(const char *path, const ms_metrics *m, const ms_confusion *c,
                             const char (*names)[64], const char *const *meta,
                             const ms_image_score *scores, int n_scores)
{
    char *s;
    MS_TRY(metrics_to_json(&s, m, c, names, meta, scores, n_scores));
    size_t n = strlen(s);
    s[n] = '\n'; /* the terminator becomes the file's last newline */
    ms_status st = fio_write_file(path, s, n + 1);
    free(s);
    return st;
}
