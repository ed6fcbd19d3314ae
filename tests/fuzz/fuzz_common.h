/* Shared by the libFuzzer harnesses: each input becomes the contents of one
 * in-memory file (memfd), opened by path as the program opens its files. */
#ifndef MS_FUZZ_COMMON_H
#define MS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of a memfd holding exactly data[0..size); one memfd per name. */
static inline const char *fuzz_file(int *fd, char path[64], const char *name, const uint8_t *data,
                                    size_t size)
{
    if (*fd < 0) {
        *fd = memfd_create(name, 0);
        if (*fd < 0) abort();
        snprintf(path, 64, "/proc/self/fd/%d", *fd);
    }
    if (ftruncate(*fd, 0) != 0) abort();
    for (size_t off = 0; off < size;) {
        ssize_t w = pwrite(*fd, data + off, size - off, (off_t)off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    return path;
}

#endif
