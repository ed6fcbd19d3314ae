/* What the views compute from a MiTA record (spec section 2): selection
 * counts, pruned fractions, scores. */
#include <math.h>
#include <string.h>

#include "render.h"

static bool has_record(const ms_result *r)
{
    return r && r->depth > 0 && r->heads > 0 && r->layer_mita && r->topk_idx && r->route &&
           r->m > 0 && r->k > 0 && r->n > 0;
}

int viz_selection_counts(int *count, const ms_result *r, int layer, int head)
{
    if (!has_record(r) || layer < 0 || layer >= r->depth || !r->layer_mita[layer]) return -1;
    memset(count, 0, sizeof *count * (size_t)r->n);
    int h0 = head < 0 ? 0 : head, h1 = head < 0 ? r->heads : head + 1;
    if (h1 > r->heads) return -1;
    for (int h = h0; h < h1; h++) {
        /* topk_idx (depth, heads, m, k): one expert's k positions are distinct,
         * so each set adds at most one to a position */
        const int32_t *idx = r->topk_idx + ((size_t)layer * r->heads + h) * r->m * r->k;
        for (int j = 0; j < r->m * r->k; j++)
            if (idx[j] >= 0 && idx[j] < r->n) count[idx[j]]++;
    }
    int mx = 0;
    for (int t = 0; t < r->n; t++)
        if (count[t] > mx) mx = count[t];
    return mx;
}

int viz_cls_picks(const ms_result *r, int layer, int head)
{
    if (!has_record(r) || r->ncls < 1 || layer < 0 || layer >= r->depth || !r->layer_mita[layer])
        return -1;
    int h0 = head < 0 ? 0 : head, h1 = head < 0 ? r->heads : head + 1, picks = 0;
    if (h1 > r->heads) return -1;
    for (int h = h0; h < h1; h++) {
        const int32_t *idx = r->topk_idx + ((size_t)layer * r->heads + h) * r->m * r->k;
        for (int j = 0; j < r->m * r->k; j++) picks += idx[j] == r->n;
    }
    return picks;
}

double viz_pruned_fraction(int *tokens, const int *count, const ms_result *r)
{
    int total = 0, pruned = 0;
    for (int t = 0; t < r->n; t++) {
        if (!viz_token_in_image(r, t)) continue;
        total++;
        pruned += count[t] == 0;
    }
    if (tokens) *tokens = total;
    return total ? (double)pruned / total : 0.0;
}

int viz_selection_max(int *scratch, const ms_result *r, int head)
{
    int mx = 0;
    for (int l = 0; r && l < r->depth; l++) {
        int m = viz_selection_counts(scratch, r, l, head);
        if (m > mx) mx = m;
    }
    return mx;
}

float viz_pixel_score(const ms_result *r, int y, int x)
{
    if (!r || !r->logits || y < 0 || x < 0 || y >= r->h || x >= r->w || r->classes < 1) return 0;
    size_t plane = (size_t)r->h * r->w, at = (size_t)y * r->w + x;
    float mx = -INFINITY;
    for (int c = 0; c < r->classes; c++) mx = fmaxf(mx, r->logits[c * plane + at]);
    double sum = 0;
    for (int c = 0; c < r->classes; c++) sum += exp((double)r->logits[c * plane + at] - mx);
    /* the argmax's probability: exp(0) / sum */
    return (float)(1.0 / sum);
}
