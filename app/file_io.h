/* Files in and out, the same way for every command.
 *
 * Inputs are opened without ever blocking (a FIFO or a device is refused with
 * one line, never waited on) and remembered by identity (device, inode).
 * Every output goes through one check (never onto a remembered input however
 * it is spelled, never onto something that is not a regular file) and one
 * atomic writer: a short temporary name in the output's folder (it fits
 * whatever the final name is), fsync, rename, fsync of the folder. The
 * temporary names being written can be removed from a signal handler, and a
 * later run removes those left behind by processes that are gone (kill -9).
 * Library code: no printing, errors via ms_last_error(). */
#ifndef MS_FILE_IO_H
#define MS_FILE_IO_H

#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "kernels/common.h"

/* (device, inode) -> int: the identity of files and folders. */
typedef struct {
    struct fio_id_slot *slots;  /* (cap), open addressing */
    size_t n, cap;
} fio_id_set;

void fio_id_set_init(fio_id_set *s);
void fio_id_set_free(fio_id_set *s);
/* Adds (dev, ino) with value val. Returns 1 when added, 0 when it was there
 * (*old, when non-NULL, gets its value), -1 when out of memory. */
int fio_id_set_add(fio_id_set *s, dev_t dev, ino_t ino, int val, int *old);
/* The value stored for (dev, ino), or -1. */
int fio_id_set_find(const fio_id_set *s, dev_t dev, ino_t ino);

/* What a file that is not a regular one is, for a message: "a FIFO",
 * "a folder", ... */
const char *fio_kind_name(mode_t m);

/* Remembers the file `sb` describes as an input of this process (the path is
 * kept for messages). Thread-safe. */
ms_status fio_note_input(const char *path, const struct stat *sb);
/* When on, fio_open_input and fio_fopen_list remember every file they open
 * (main() turns it on for every command: a program never replaces what it
 * read). Off by default, so a library user may rewrite a file it read. */
void fio_remember_inputs(bool on);
/* Forgets every input (tests). */
void fio_forget_inputs(void);

/* Opens path read-only without blocking (O_NONBLOCK, cleared once open),
 * refuses anything but a regular file ("PATH: not a regular file (a FIFO)")
 * and notes it as an input (fio_remember_inputs). *sb gets its fstat when
 * non-NULL. */
ms_status fio_open_input(int *fd, const char *path, struct stat *sb);
/* The same as a stdio stream ("rb"). */
ms_status fio_fopen_input(FILE **f, const char *path);
/* A list of paths: a regular file or a pipe (`--list <(find ...)`); a folder,
 * a device or a socket is refused. A FIFO without a writer reads as empty,
 * never blocks. Noted as an input. */
ms_status fio_fopen_list(FILE **f, const char *path);

/* MS_OK when writing `path` replaces no input noted so far and nothing that
 * is not a regular file; else MS_ERR_ARG with "output PATH would overwrite
 * the input INPUT", MS_ERR_IO for "... exists and is a folder" etc. */
ms_status fio_check_output(const char *path);
/* fio_check_output, and a file can be created in path's folder (tried, then
 * removed): for outputs written only after a long run. */
ms_status fio_check_writable(const char *path);

/* One output being written: f writes to the temporary file. */
typedef struct {
    FILE *f;
    char *path;     /* final name (owned copy) */
    char *tmp;      /* temporary name in the same folder (owned) */
    int slot;       /* in the live-temp table, -1 when none was free */
} fio_atomic;

/* fio_check_output, then creates the temporary file ("wb"). */
ms_status fio_atomic_begin(fio_atomic *a, const char *path);
/* Flushes, fsyncs, closes, renames over path and fsyncs the folder. On any
 * failure the temporary file is removed and path is left as it was. */
ms_status fio_atomic_commit(fio_atomic *a);
/* Closes and removes the temporary file; path is left as it was. */
void fio_atomic_abort(fio_atomic *a);
/* A whole buffer to path, atomically. */
ms_status fio_write_file(const char *path, const void *data, size_t n);

/* True when `name` (no folder) is a temporary name of this program. */
bool fio_is_temp_name(const char *name);
/* Removes from folder dir the temporary files of this program left by
 * processes of this machine that no longer run, or by an earlier boot of it.
 * Returns how many (a folder that cannot be read counts 0). */
int fio_remove_stale_temps(const char *dir);
/* Async-signal-safe: removes the temporary files being written right now. */
void fio_remove_live_temps(void);

#endif
