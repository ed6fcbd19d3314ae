/* Batch mode plumbing for `mitaseg segment` and `mitaseg eval`: which files to
 * read (files, folders, list files, standard input), which slice of them this
 * process takes (--shard), where each result goes (mirrored sub-folders, never
 * onto an input), and the pixel work around the engine (tiles, colours,
 * overlays). Library code: no printing, errors via ms_last_error(). */
#ifndef MS_BATCH_H
#define MS_BATCH_H

#include <stdio.h>
#include <sys/types.h>

#include "engine.h"
#include "file_io.h"
#include "kernels/common.h"

typedef struct {
    char *path;     /* as opened: given path, dir/rel, or list-folder/line */
    char *rel;      /* output name before the extension change: the path below
                     * the given folder, the list line when it is relative and
                     * stays inside (no ".."), else the base name */
    dev_t dev;      /* identity of the input file, so no output replaces it */
    ino_t ino;
    bool exists;    /* stat() succeeded (a missing list entry fails later,
                     * with the other per-file errors) */
    bool loose;     /* a list entry that is absolute or leaves its folder:
                     * rel is its base name until batch_place_loose */
} ms_batch_item;

typedef struct {
    ms_batch_item *items;   /* (n) */
    int n, cap;
    /* Folders never descended into (the output folder when it lies inside an
     * input folder, so a rerun does not segment its own masks). */
    dev_t skip_dev;
    ino_t skip_ino;
    bool has_skip;
    /* Folders walked, by identity: a link loop (loop -> ., up -> ..) or a
     * second way to a folder adds nothing more. Folders reached through a
     * symbolic link wait in `linked` until the real tree is walked, so the
     * real path wins and outputs mirror the real folders. */
    fio_id_set visited;
    struct ms_batch_link *linked;   /* (n_linked) */
    int n_linked, cap_linked;
    /* Entries that could not be added, one message each ("list.txt:2: NUL
     * byte in a path", an unreadable sub-folder): the command reports them
     * and counts them as failed; enumeration goes on past them. */
    char **bad;     /* (n_bad) */
    int n_bad, cap_bad;
} ms_batch_list;

void batch_list_init(ms_batch_list *l);
void batch_list_free(ms_batch_list *l);
/* Folder `dir` is not descended into by -r (ignored when it does not exist
 * yet); given explicitly, it is still read. */
void batch_list_skip_dir(ms_batch_list *l, const char *dir);

/* True for names that folder enumeration picks up: .png, .jpg, .jpeg (any
 * case). Temp files ("x.png.tmp-123") and hidden files are not. */
bool batch_is_image_name(const char *name);

/* A file is added as it is (whatever its name; a bad one fails when read).
 * A folder adds its image files, and those of its sub-folders when recursive;
 * rel is the path below the folder. A missing path is an error; an entry
 * below the folder that cannot be read (a sub-folder without permission, a
 * dangling link or a FIFO with an image's name) goes to l->bad. */
ms_status batch_add_path(ms_batch_list *l, const char *path, bool recursive);
/* One path per line (blank lines and lines starting with '#' skipped, trailing
 * CR and spaces removed); relative paths are relative to base_dir (NULL: the
 * working directory). `name` is used in error messages. Entries that do not
 * exist are kept (they fail like unreadable files); folders are expanded as
 * batch_add_path does; a line holding a NUL byte goes to l->bad and the
 * lines after it are still read. */
ms_status batch_add_stream(ms_batch_list *l, FILE *f, const char *name, const char *base_dir,
                           bool recursive);
/* batch_add_stream on a file or a pipe (fio_fopen_list); base_dir is the
 * list file's folder. */
ms_status batch_add_list_file(ms_batch_list *l, const char *list_path, bool recursive);

/* Loose entries (absolute or ".." list lines, like `find /data -name '*.jpg'`
 * output) get as rel their path below the deepest folder holding all of
 * them, so their sub-folders are mirrored and equal base names in different
 * folders do not collide. Entries that do not exist keep their base name.
 * Call once every input is added (the result depends on all of them). */
ms_status batch_place_loose(ms_batch_list *l);

/* Sorts by path (byte order) and drops repeated paths, so every process given
 * the same inputs sees the same order whatever the argument or directory order. */
void batch_sort_unique(ms_batch_list *l);

/* "I/N" with 1 <= I <= N. */
ms_status batch_parse_shard(int *index, int *count, const char *s);
/* The shard rule: position p (0-based) of the sorted list belongs to shard
 * index (1-based) of count when p % count == index - 1. */
static inline bool batch_in_shard(int p, int index, int count)
{
    return p % count == index - 1;
}
/* Keeps items whose position p in the sorted list has p % count == index - 1.
 * Shards 1..N of one list are disjoint and together are the list. */
void batch_shard(ms_batch_list *l, int index, int count);

/* out_dir/rel with the extension replaced by suffix (".png",
 * ".overlay.png"). Caller frees *out. */
ms_status batch_output_path(char **out, const char *out_dir, const char *rel, const char *suffix);

/* Notes every existing item as an input (fio_note_input), so that
 * fio_check_output and every writer refuse to replace any of them, however
 * spelled. Call before sharding, so one shard does not overwrite what
 * another shard reads. */
ms_status batch_note_inputs(const ms_batch_list *l);

/* Output outputs[i] equals an earlier outputs[j] (two inputs mapping to one
 * name, like a.jpg and a.png): dup[i] = j, else -1. n entries. */
ms_status batch_find_collisions(int *dup /* (n) */, char *const *outputs, int n);

/* --skip-existing: the file is there, regular and non-empty. Writers go
 * through a temp name and rename, so an existing name is a finished file. */
bool batch_output_done(const char *path);

/* mkdir -p of the folder holding `path`. */
ms_status batch_make_parent_dirs(const char *path);

/* Sliding windows along one axis of `len` pixels: tiles of `tile` pixels
 * stepping by tile - overlap, the last one flush with the end; one window
 * (0, len) when len <= tile. Returns the count and writes starts[0..count)
 * when starts is non-NULL. Requires 0 <= overlap < tile. */
int batch_tile_starts(int *starts, int len, int tile, int overlap);

/* Runs one crop through the model: fills *logits (classes, ch, cw), owned by
 * the callee and valid until the next call. */
typedef ms_status (*batch_run_fn)(void *ctx, const float **logits, const uint8_t *crop_rgb,
                                  int cw, int ch);

/* --tile: runs every window of rgb (h, w, 3) through `run`, averages the
 * logits where windows overlap and writes the averaged logits (when logits is
 * non-NULL) and their argmax (ties to the lower class, as the engine). */
ms_status batch_run_tiled(uint8_t *mask /* (h, w) */, float *logits /* (classes, h, w) or NULL */,
                          const uint8_t *rgb /* (h, w, 3) */, int w, int h, int classes,
                          int tile, int overlap, batch_run_fn run, void *ctx);

/* --tile with the engine: each window runs through engine_run with opt
 * (res is reused as the per-window scratch result). */
ms_status batch_segment_tiled(uint8_t *mask /* (h, w) */, ms_engine *e, ms_result *res,
                              const ms_run_options *opt, const ms_image *img, int tile,
                              int overlap);

/* Class colours: rgb[p] = palette[mask[p]] (black for ids past n_palette). */
void batch_colorize(uint8_t *rgb /* (n, 3) */, const uint8_t *mask /* (n) */, size_t n,
                    const uint8_t (*palette)[3], int n_palette);
/* --overlay: out = (image + colour) / 2, rounded. */
void batch_blend(uint8_t *out /* (n, 3) */, const uint8_t *img /* (n, 3) */,
                 const uint8_t *mask /* (n) */, size_t n, const uint8_t (*palette)[3],
                 int n_palette);

#endif
