/* Per-layer statistics of a MiTA run, the numbers behind the viewer's depth
 * chart, stats view and sweep view, `mitaseg render --view stats|sweep`,
 * the viewer's NAME.stats.json and `mitaseg segment --stats`: one function
 * computes them from engine results (or from a --dump read back), so every
 * consumer shows the same numbers. Library code: no printing. */
#ifndef MS_STATS_H
#define MS_STATS_H

#include <stdio.h>

#include "engine.h"
#include "file_io.h"

typedef struct {
    int depth, heads, m, k, n;  /* of the MiTA run */
    int image_tokens;           /* tokens covering some of the image (not only padding) */
    int picks;                  /* m * k: picks made per head and layer */
    int classes;
    uint8_t *mita;              /* (depth) 1: layer ran MiTA (the rows below are set) */
    /* fractions of the image tokens picked by no expert */
    double *pruned;             /* (depth) of any head */
    double *pruned_head;        /* (depth, heads) of that head */
    double *shared_share;       /* (depth) mean share of attention mass on the shared
                                 * summaries, over heads and image tokens */
    double *distinct;           /* (depth) distinct positions picked, mean over heads */
    double *distinct_all;       /* (depth) distinct positions picked by any head */
    double *jaccard;            /* (depth) mean Jaccard overlap of two experts' sets
                                 * (every pair within a head), mean over heads */
    /* against a full-attention run of the same image (have_full) */
    bool have_full, have_blocks;
    double *block_diff;         /* (depth) ||x_mita - x_full|| / ||x_full|| of each block's
                                 * output over the image tokens; set when have_blocks */
    int64_t pixels, changed;    /* pixels, and those whose class differs */
    int64_t *changed_mita;      /* (classes) changed pixels by MiTA's class */
    int64_t *changed_full;      /* (classes) changed pixels by full attention's class */
} ms_stats;

/* One run of the budget sweep. */
typedef struct {
    char label[16];             /* "k/4", "k", "grid-1", ... */
    int gh, gw, k;              /* asked budget (the engine clamps it) */
    bool done;                  /* agreement and ms are set */
    double agreement;           /* fraction of pixels with full attention's class */
    double ms;                  /* forward-pass time */
} ms_sweep_point;

#define MS_SWEEP_MAX 8

/* Fills st from a MiTA result with a record (mita) and optionally a
 * full-attention result of the same image (full: NULL or without blocks is
 * fine; the block differences then stay unset). Replaces what st held. */
ms_status stats_compute(ms_stats *st, const ms_result *mita, const ms_result *full);
void stats_free(ms_stats *st);

/* The sweep around budget (gh, gw, k): k/4, k/2, k, 2k, 4k at the grid, then
 * the grid one smaller and one larger per side at k; budgets outside
 * 1..n (k) or 1..hp x wp (grid) are left out. Returns the count. */
int stats_sweep_plan(ms_sweep_point *pts /* (MS_SWEEP_MAX) */, int gh, int gw, int k, int hp, int wp,
                     int n);

/* The options of a run compared with the shown run (shown: the options it
 * ran with): its full-attention reference (attention MS_ATTN_FULL, budget
 * 0) or a sweep point (MS_ATTN_MITA at gh x gw, k). The shown run's
 * working size (short_side) and flip TTA are kept, so that the comparison
 * measures the attention alone, not a resize (a reference at another
 * working size also has another token count: no block differences); no
 * record, no blocks, full-size logits. */
ms_run_options stats_compare_options(const ms_run_options *shown, int attention, int gh, int gw, int k);

/* Runs one sweep point on img (MiTA at the point's budget, otherwise as the
 * shown run: stats_compare_options) into scratch and sets its agreement
 * with full_mask (h, w) and its time (of a second run: the first at a
 * budget also builds the engine's plan for it). */
ms_status stats_run_sweep_point(ms_sweep_point *pt, ms_engine *e, ms_result *scratch, const ms_image *img,
                                const uint8_t *full_mask /* (h, w) */, const ms_run_options *shown);

/* The statistics as one JSON object (caller frees with free()): image name,
 * budget, "layers": [{layer, mita, pruned, pruned_per_head, shared_share,
 * distinct, distinct_all, picks, jaccard, block_rel_l2}], "vs_full":
 * {pixels, changed, agreement, classes: [{name, changed_mita, changed_full}]}
 * or null, "sweep": [{label, landmarks, topk, agreement, ms}] when n_sweep > 0.
 * pretty: indented (files) or one line (JSON lines). */
ms_status stats_to_json(char **out, const ms_stats *st, const ms_result *mita, const char *image,
                        const char (*class_names)[MS_CLASS_NAME], const ms_sweep_point *sweep,
                        int n_sweep, bool pretty);
/* A text file written line by line that appears under its name only when
 * closed with keep (temp file, fsync, rename), so no reader ever sees half
 * of it. */
typedef struct {
    fio_atomic a;   /* a.f is NULL when not open */
} ms_text_out;

/* keep_lines: the file's present lines are carried over first. */
ms_status text_out_open(ms_text_out *o, const char *path, bool keep_lines);
/* Appends line and a newline. */
ms_status text_out_line(ms_text_out *o, const char *line);
/* keep: flush, fsync and rename into place; else remove the temp file. */
ms_status text_out_close(ms_text_out *o, bool keep);
/* The whole file at once. */
ms_status stats_write_text(const char *path, const char *text);

#endif
