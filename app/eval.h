/* Segmentation metrics for `mitaseg eval`: one confusion matrix over a whole
 * data set, then per-class IoU and accuracy and their means, as mmsegmentation
 * reports them. Library code: no printing, errors via ms_last_error(). */
#ifndef MS_EVAL_H
#define MS_EVAL_H

#include "kernels/common.h"

typedef struct {
    int n_classes;
    int ignore_index;       /* label value skipped; -1: none */
    uint64_t *cm;           /* (n_classes, n_classes): row = label, column = prediction */
    uint64_t ignored;       /* pixels whose label is the ignore index */
    uint64_t out_of_range;  /* pixels whose label is >= n_classes (not ignore): skipped */
    uint64_t bad_pred;      /* predictions >= n_classes: skipped (cannot come from argmax) */
    int images;             /* pairs added */
} ms_confusion;

ms_status confusion_init(ms_confusion *c, int n_classes, int ignore_index);
void confusion_free(ms_confusion *c);
/* Zeroes the counts (the class count and ignore index stay). */
void confusion_clear(ms_confusion *c);
/* Adds src's counts into dst (the same class count). */
void confusion_merge(ms_confusion *dst, const ms_confusion *src);
/* Adds one image's pixels. */
void confusion_add(ms_confusion *c, const uint8_t *label /* (n) */, const uint8_t *pred /* (n) */,
                   size_t n);

typedef struct {
    int n_classes;
    /* per class; NaN where undefined */
    double *iou;        /* (n) tp / (label + pred - tp); NaN when the class is in neither */
    double *acc;        /* (n) tp / label; NaN when the class is not in the labels */
    uint64_t *label_px; /* (n) labelled pixels of the class */
    uint64_t *pred_px;  /* (n) predicted pixels of the class (on labelled pixels) */
    double aacc;        /* correct / labelled pixels (NaN when none) */
    double miou;        /* mean IoU over classes in the labels or the predictions */
    double macc;        /* mean accuracy over classes in the labels */
    int n_iou, n_acc;   /* classes in each mean */
    uint64_t labelled;  /* pixels counted */
} ms_metrics;

/* Metrics from the matrix. Classes absent from both the labels and the
 * predictions have no IoU and leave mIoU alone (a 0/0, not a 0); a class
 * predicted but never labelled has IoU 0 (every pixel of it is wrong) and no
 * accuracy, as in mmsegmentation's nanmean. All values are fractions (0..1). */
ms_status metrics_compute(ms_metrics *m, const ms_confusion *c);
void metrics_free(ms_metrics *m);

/* One image's scores, for the per-image list of the JSON. */
typedef struct {
    const char *image, *label; /* not owned */
    double miou, aacc;         /* fractions; NaN when undefined */
    uint64_t labelled;         /* pixels scored */
} ms_image_score;

/* Writes the metrics as JSON (atomically: temp file + rename):
 * {"aAcc", "mIoU", "mAcc" (percent), "classes": [{"name", "IoU", "Acc",
 * "label_pixels", "pred_pixels"}] (null where undefined), "confusion":
 * [[pixels]] (row = label, column = prediction), "pixels": {...},
 * "per_image": [{"image", "label", "mIoU", "aAcc", "labelled"}] (in the
 * order given; only with scores),
 * plus meta pairs {key, value, ..., NULL} as strings and numbers as given
 * (a value that parses fully as a number is written as a number). */
ms_status metrics_write_json(const char *path, const ms_metrics *m, const ms_confusion *c,
                             const char (*names)[64], const char *const *meta,
                             const ms_image_score *scores /* (n_scores) or NULL */,
                             int n_scores);
/* The same document as a string (caller frees with free()). */
ms_status metrics_to_json(char **out, const ms_metrics *m, const ms_confusion *c,
                          const char (*names)[64], const char *const *meta,
                          const ms_image_score *scores /* (n_scores) or NULL */, int n_scores);

#endif
