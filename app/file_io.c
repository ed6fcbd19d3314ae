/* Inputs opened without blocking and remembered; outputs checked against them
 * and written atomically through short temporary names. */
#include "file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ id sets */

struct fio_id_slot {
    uint64_t dev, ino;
    int val;
    bool used;
};

void fio_id_set_init(fio_id_set *s) { memset(s, 0, sizeof *s); }

void fio_id_set_free(fio_id_set *s)
{
    free(s->slots);
    memset(s, 0, sizeof *s);
}

static size_t id_hash(uint64_t dev, uint64_t ino)
{
    uint64_t h = (ino ^ (dev * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
    return (size_t)(h ^ (h >> 31));
}

static struct fio_id_slot *id_lookup(struct fio_id_slot *slots, size_t cap, uint64_t dev,
                                     uint64_t ino)
{
    size_t i = id_hash(dev, ino) & (cap - 1);
    while (slots[i].used && !(slots[i].dev == dev && slots[i].ino == ino)) i = (i + 1) & (cap - 1);
    return &slots[i];
}

int fio_id_set_add(fio_id_set *s, dev_t dev, ino_t ino, int val, int *old)
{
    if (2 * (s->n + 1) > s->cap) { /* at most half full: short probes */
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct fio_id_slot *ns = calloc(cap, sizeof *ns);
        if (!ns) return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i].used) *id_lookup(ns, cap, s->slots[i].dev, s->slots[i].ino) = s->slots[i];
        free(s->slots);
        s->slots = ns;
        s->cap = cap;
    }
    struct fio_id_slot *e = id_lookup(s->slots, s->cap, (uint64_t)dev, (uint64_t)ino);
    if (e->used) {
        if (old) *old = e->val;
        return 0;
    }
    *e = (struct fio_id_slot){.dev = (uint64_t)dev, .ino = (uint64_t)ino, .val = val, .used = true};
    s->n++;
    return 1;
}

int fio_id_set_find(const fio_id_set *s, dev_t dev, ino_t ino)
{
    if (!s->cap) return -1;
    const struct fio_id_slot *e = id_lookup(s->slots, s->cap, (uint64_t)dev, (uint64_t)ino);
    return e->used ? e->val : -1;
}

/* ------------------------------------------------------------- inputs */

static bool g_remember; /* fio_open_input and fio_fopen_list note what they open */
static pthread_mutex_t g_inputs_mu = PTHREAD_MUTEX_INITIALIZER;
static fio_id_set g_inputs;      /* identity -> index into g_input_path */
static char **g_input_path;      /* (g_n_inputs) as first opened, for messages */
static int g_n_inputs, g_cap_inputs;

ms_status fio_note_input(const char *path, const struct stat *sb)
{
    ms_status st = MS_OK;
    pthread_mutex_lock(&g_inputs_mu);
    if (fio_id_set_find(&g_inputs, sb->st_dev, sb->st_ino) < 0) {
        if (g_n_inputs == g_cap_inputs) {
            int cap = g_cap_inputs ? 2 * g_cap_inputs : 64;
            char **np = realloc(g_input_path, (size_t)cap * sizeof *np);
            if (np) g_input_path = np, g_cap_inputs = cap;
        }
        char *copy = g_n_inputs < g_cap_inputs ? strdup(path) : NULL;
        if (!copy || fio_id_set_add(&g_inputs, sb->st_dev, sb->st_ino, g_n_inputs, NULL) < 0) {
            free(copy);
            st = ms_error(MS_ERR_OOM, "out of memory: remembering the input %s at %s:%d", path,
                          __FILE__, __LINE__);
        } else {
            g_input_path[g_n_inputs++] = copy;
        }
    }
    pthread_mutex_unlock(&g_inputs_mu);
    return st;
}

void fio_remember_inputs(bool on) { __atomic_store_n(&g_remember, on, __ATOMIC_RELAXED); }

static ms_status remember(const char *path, const struct stat *sb)
{
    return __atomic_load_n(&g_remember, __ATOMIC_RELAXED) ? fio_note_input(path, sb) : MS_OK;
}

void fio_forget_inputs(void)
{
    pthread_mutex_lock(&g_inputs_mu);
    for (int i = 0; i < g_n_inputs; i++) free(g_input_path[i]);
    free(g_input_path);
    g_input_path = NULL;
    g_n_inputs = g_cap_inputs = 0;
    fio_id_set_free(&g_inputs);
    pthread_mutex_unlock(&g_inputs_mu);
}

const char *fio_kind_name(mode_t m)
{
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

/* open(O_NONBLOCK) returns at once even for a FIFO without a writer, where a
 * plain open() would wait for one for ever. */
static ms_status open_nonblocking(int *fd, const char *path, struct stat *sb)
{
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (*fd < 0) return ms_error(MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(*fd, sb) != 0) {
        int err = errno;
        close(*fd);
        return ms_error(MS_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    return MS_OK;
}

static ms_status clear_nonblock(int fd, const char *path)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        return ms_error(MS_ERR_IO, "%s: fcntl: %s", path, strerror(err));
    }
    return MS_OK;
}

ms_status fio_open_input(int *fd, const char *path, struct stat *sb)
{
    struct stat own;
    if (!sb) sb = &own;
    MS_TRY(open_nonblocking(fd, path, sb));
    if (!S_ISREG(sb->st_mode)) {
        close(*fd);
        return ms_error(MS_ERR_IO, "%s: not a regular file (%s)", path,
                        fio_kind_name(sb->st_mode));
    }
    MS_TRY(clear_nonblock(*fd, path));
    ms_status st = remember(path, sb);
    if (st != MS_OK) close(*fd);
    return st;
}

static ms_status fdopen_read(FILE **f, int fd, const char *path)
{
    *f = fdopen(fd, "rb");
    if (!*f) {
        int err = errno;
        close(fd);
        return ms_error(MS_ERR_IO, "%s: cannot open: %s", path, strerror(err));
    }
    return MS_OK;
}

ms_status fio_fopen_input(FILE **f, const char *path)
{
    int fd;
    MS_TRY(fio_open_input(&fd, path, NULL));
    return fdopen_read(f, fd, path);
}

ms_status fio_fopen_list(FILE **f, const char *path)
{
    int fd;
    struct stat sb;
    MS_TRY(open_nonblocking(&fd, path, &sb));
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return ms_error(MS_ERR_ARG, "%s: is a folder, not a list file", path);
    }
    if (!S_ISREG(sb.st_mode) && !S_ISFIFO(sb.st_mode)) {
        close(fd);
        return ms_error(MS_ERR_IO, "%s: not a regular file or a pipe (%s)", path,
                        fio_kind_name(sb.st_mode));
    }
    MS_TRY(clear_nonblock(fd, path));
    if (S_ISREG(sb.st_mode)) {
        ms_status st = remember(path, &sb);
        if (st != MS_OK) {
            close(fd);
            return st;
        }
    }
    return fdopen_read(f, fd, path);
}

/* ------------------------------------------------------------ outputs */

ms_status fio_check_output(const char *path)
{
    /* A name past the limit fails only at the rename, after all the work:
     * say so first (ENOENT of a folder not made yet would hide it). */
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, "/");
        if (len > NAME_MAX)
            return ms_error(MS_ERR_ARG, "%s: File name too long (a name of %zu bytes; "
                            "the limit is %d)", path, len, NAME_MAX);
        p += len;
        while (*p == '/') p++;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) return MS_OK; /* nothing there (or unreachable: the write says) */
    if (!S_ISREG(sb.st_mode))
        return ms_error(MS_ERR_IO, "%s: exists and is %s, not a regular file; not replacing it",
                        path, fio_kind_name(sb.st_mode));
    ms_status st = MS_OK;
    pthread_mutex_lock(&g_inputs_mu);
    int k = fio_id_set_find(&g_inputs, sb.st_dev, sb.st_ino);
    if (k >= 0)
        st = ms_error(MS_ERR_ARG, "%s: would overwrite the input %s", path, g_input_path[k]);
    pthread_mutex_unlock(&g_inputs_mu);
    return st;
}

ms_status fio_check_writable(const char *path)
{
    fio_atomic a;
    MS_TRY(fio_atomic_begin(&a, path));
    fio_atomic_abort(&a);
    return MS_OK;
}

/* The live-temp table: what the signal handler removes. Slots are claimed
 * with a compare-and-swap and published (state 2) only once the path is
 * complete, so the handler never reads a half-written one. */
enum { LIVE_SLOTS = 64 };
static char g_live_path[LIVE_SLOTS][PATH_MAX];
static int g_live_state[LIVE_SLOTS]; /* 0 free, 1 being filled, 2 live */

static int live_claim(const char *tmp)
{
    size_t n = strlen(tmp);
    if (n >= PATH_MAX) return -1;
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int zero = 0;
        if (__atomic_compare_exchange_n(&g_live_state[i], &zero, 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            memcpy(g_live_path[i], tmp, n + 1);
            __atomic_store_n(&g_live_state[i], 2, __ATOMIC_RELEASE);
            return i;
        }
    }
    return -1; /* more than 64 writes at once: this one is not removed on a signal */
}

static void live_release(int slot)
{
    if (slot >= 0) __atomic_store_n(&g_live_state[slot], 0, __ATOMIC_RELEASE);
}

void fio_remove_live_temps(void)
{
    for (int i = 0; i < LIVE_SLOTS; i++)
        if (__atomic_load_n(&g_live_state[i], __ATOMIC_ACQUIRE) == 2) unlink(g_live_path[i]);
}

/* Temporary names: ".mitaseg-HOST-BOOT-PID-SEQ.tmp". HOST is 8 hex digits of
 * a hash of the host name, so a run only ever removes temporaries of
 * processes it can see (a folder shared over the network has other hosts'
 * PIDs); BOOT, of the kernel's boot id, so after a reboot (a power loss)
 * the old temporaries go even where their PID now belongs to another
 * process. At most 59 bytes (about 40 in practice): fits in any folder
 * whatever the final name's length. */
static const char temp_prefix[] = ".mitaseg-";

static uint32_t g_host_id, g_boot_id; /* g_boot_id 0: unknown */
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void host_id_init(void)
{
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    g_host_id = fnv1a(name);
    char boot[64] = "";
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, boot, sizeof boot - 1);
        close(fd);
        boot[n > 0 ? n : 0] = '\0';
        boot[strcspn(boot, "\n")] = '\0';
    }
    g_boot_id = boot[0] ? fnv1a(boot) : 0;
    if (boot[0] && !g_boot_id) g_boot_id = 1; /* 0 means unknown */
}

static void this_host(uint32_t *host, uint32_t *boot)
{
    pthread_once(&g_host_once, host_id_init);
    *host = g_host_id;
    *boot = g_boot_id;
}

static bool parse_hex8(const char **p, uint32_t *v)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(*p, &end, 16);
    if (end != *p + 8 || *end != '-' || errno) return false;
    *v = (uint32_t)x;
    *p = end + 1;
    return true;
}

/* Parses a temporary name; false when it is not one. */
static bool parse_temp_name(const char *name, uint32_t *host, uint32_t *boot, long *pid)
{
    size_t lp = sizeof temp_prefix - 1;
    if (strncmp(name, temp_prefix, lp) != 0) return false;
    const char *p = name + lp;
    if (!parse_hex8(&p, host) || !parse_hex8(&p, boot)) return false;
    char *end;
    long id = strtol(p, &end, 10);
    if (end == p || *end != '-' || id <= 0 || errno) return false;
    p = end + 1;
    strtoul(p, &end, 10);
    if (end == p || strcmp(end, ".tmp") != 0 || errno) return false;
    *pid = id;
    return true;
}

bool fio_is_temp_name(const char *name)
{
    uint32_t h, b;
    long pid;
    return parse_temp_name(name, &h, &b, &pid);
}

int fio_remove_stale_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    uint32_t me, my_boot;
    this_host(&me, &my_boot);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        uint32_t h, b;
        long pid;
        if (!parse_temp_name(de->d_name, &h, &b, &pid) || h != me) continue;
        /* An earlier boot's: every process of it is gone, whatever its PID. */
        bool stale = b && my_boot && b != my_boot;
        /* This boot's: gone when no such process (EPERM: another user's, alive). */
        if (!stale && pid != (long)getpid())
            stale = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (stale && unlinkat(dirfd(d), de->d_name, 0) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* path's folder: "." for a bare name, "/" for a file in the root. Caller frees. */
static char *parent_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

ms_status fio_atomic_begin(fio_atomic *a, const char *path)
{
    static unsigned long seq;
    memset(a, 0, sizeof *a);
    a->slot = -1;
    if (!*path) return ms_error(MS_ERR_ARG, "empty output file name");
    if (path[strlen(path) - 1] == '/') return ms_error(MS_ERR_ARG, "%s: is a folder name", path);
    MS_TRY(fio_check_output(path));
    char *dir = parent_of(path);
    MS_CHECK_ALLOC(dir, strlen(path));
    size_t n = strlen(dir) + 80;
    a->tmp = malloc(n);
    a->path = strdup(path);
    if (!a->tmp || !a->path) {
        free(dir);
        free(a->tmp);
        free(a->path);
        return ms_error(MS_ERR_OOM, "out of memory: writing %s at %s:%d", path, __FILE__, __LINE__);
    }
    uint32_t host, boot;
    this_host(&host, &boot);
    int fd = -1;
    /* A name can exist already only when the boot id is unknown and an
     * earlier boot's process had this PID: then the next number. */
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(a->tmp, n, "%s/%s%08x-%08x-%ld-%lu.tmp", dir, temp_prefix, (unsigned)host,
                 (unsigned)boot, (long)getpid(), __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
        /* Published before it exists, so a signal between the open and the
         * claim cannot leave it behind (unlinking a name not there is harmless). */
        a->slot = live_claim(a->tmp);
        fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            int err = errno;
            live_release(a->slot);
            a->slot = -1;
            errno = err;
            if (err != EEXIST) break;
        }
    }
    free(dir);
    if (fd < 0 || !(a->f = fdopen(fd, "wb"))) {
        int err = errno;
        if (fd >= 0) {
            close(fd);
            unlink(a->tmp);
        }
        live_release(a->slot);
        ms_status st = ms_error(MS_ERR_IO, "%s: cannot create a file in its folder: %s", path,
                                strerror(err));
        free(a->tmp);
        free(a->path);
        memset(a, 0, sizeof *a);
        a->slot = -1;
        return st;
    }
    return MS_OK;
}

static void atomic_release(fio_atomic *a)
{
    live_release(a->slot);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
    a->slot = -1;
}

void fio_atomic_abort(fio_atomic *a)
{
    if (!a->tmp) return;
    if (a->f) fclose(a->f);
    unlink(a->tmp);
    atomic_release(a);
}

/* The rename is durable only once the folder's entry is on disk. Some file
 * systems cannot fsync a folder (EINVAL): nothing more can be done there. */
static int fsync_dir(const char *path)
{
    char *dir = parent_of(path);
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return errno;
    int err = fsync(fd) == 0 || errno == EINVAL || errno == EROFS ? 0 : errno;
    close(fd);
    return err;
}

ms_status fio_atomic_commit(fio_atomic *a)
{
    if (!a->f) return ms_error(MS_ERR_ARG, "commit of an output that was not begun");
    /* Buffered write errors (disk full) show up only at fflush/fclose. */
    int err = 0;
    const char *what = "write";
    if (fflush(a->f) != 0 || ferror(a->f)) err = errno ? errno : EIO;
    else if (fsync(fileno(a->f)) != 0) err = errno, what = "fsync";
    if (fclose(a->f) != 0 && !err) err = errno, what = "close";
    a->f = NULL;
    if (!err && rename(a->tmp, a->path) != 0) err = errno, what = "rename";
    if (err) {
        unlink(a->tmp);
        ms_status st = ms_error(MS_ERR_IO, "%s: %s failed: %s", a->path, what, strerror(err));
        atomic_release(a);
        return st;
    }
    live_release(a->slot); /* renamed: nothing of ours under the temp name now */
    a->slot = -1;
    err = fsync_dir(a->path);
    ms_status st = err ? ms_error(MS_ERR_IO, "%s: fsync of its folder failed: %s", a->path,
                                  strerror(err))
                       : MS_OK;
    atomic_release(a);
    return st;
}

ms_status fio_write_file(const char *path, const void *data, size_t n)
{
    fio_atomic a;
    MS_TRY(fio_atomic_begin(&a, path));
    if (n && fwrite(data, 1, n, a.f) != n) {
        int err = errno;
        fio_atomic_abort(&a);
        return ms_error(MS_ERR_IO, "%s: write failed: %s", path, strerror(err));
    }
    return fio_atomic_commit(&a);
}
