/* app/file_io: inputs opened without blocking and remembered, the one output
 * check (every spelling of an input refused), the atomic writer (short temp
 * names, nothing partial), and the removal of temporaries left by killed
 * processes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "app/file_io.h"
#include "testutil.h"

static void setup(void) { test_dir_create("file_io"); }
static void teardown(void) { test_dir_remove(); }

/* This program's temporary files in dir. */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += fio_is_temp_name(e->d_name);
    closedir(d);
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

START_TEST(fifo_and_devices_refused_without_blocking)
{
    const char *fifo = test_path("f.png");
    ck_assert_int_eq(mkfifo(fifo, 0666), 0);
    double t0 = now_s();
    int fd;
    ck_assert_int_eq(fio_open_input(&fd, fifo, NULL), MS_ERR_IO);
    assert_error_names(fifo, "not a regular file (a FIFO)");
    ck_assert_int_eq(fio_open_input(&fd, "/dev/null", NULL), MS_ERR_IO);
    assert_error_names("/dev/null", "a character device");
    ck_assert_int_eq(fio_open_input(&fd, test_dir, NULL), MS_ERR_IO);
    assert_error_names(test_dir, "a folder");
    /* a list may be a FIFO: without a writer it reads as empty, at once */
    FILE *f;
    ck_assert_int_eq(fio_fopen_list(&f, fifo), MS_OK);
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
    ck_assert_int_eq(fio_fopen_list(&f, "/dev/zero"), MS_ERR_IO);
    ck_assert_int_eq(fio_fopen_list(&f, test_dir), MS_ERR_ARG);
    ck_assert_double_lt(now_s() - t0, 2.0);
    /* and a pipe (process substitution) is read */
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(write(p[1], "a.png\n", 6), 6);
    close(p[1]);
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", p[0]);
    ck_assert_int_eq(fio_fopen_list(&f, name), MS_OK);
    char line[16] = "";
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_str_eq(line, "a.png\n");
    fclose(f);
    close(p[0]);
}
END_TEST

START_TEST(inputs_refused_however_spelled)
{
    fio_remember_inputs(true);
    write_bytes(test_path("x.png"), "input", 5);
    ck_assert_int_eq(mkdir(test_path("d"), 0777), 0);
    int fd;
    ck_assert_int_eq(fio_open_input(&fd, test_path("x.png"), NULL), MS_OK);
    close(fd);
    ck_assert_int_eq(symlink("x.png", test_path("sym.png")), 0);
    ck_assert_int_eq(link(test_path("x.png"), test_path("hard.png")), 0);
    const char *spellings[] = {test_path("x.png"), test_path("d/../x.png"), test_path("./x.png"),
                               test_path("sym.png"), test_path("hard.png")};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(fio_check_output(spellings[i]), MS_ERR_ARG);
        assert_error_names(spellings[i], "would overwrite the input");
        ck_assert_int_eq(fio_write_file(spellings[i], "out", 3), MS_ERR_ARG);
    }
    size_t n;
    uint8_t *b = read_bytes(test_path("x.png"), &n);
    ck_assert_mem_eq(b, "input", 5);
    free(b);
    ck_assert_int_eq(count_temps(test_dir), 0);
    /* not an input: replaced */
    write_bytes(test_path("other.png"), "old", 3);
    ck_assert_int_eq(fio_write_file(test_path("other.png"), "new", 3), MS_OK);
    /* noted explicitly (a batch list) works the same */
    struct stat sb;
    ck_assert_int_eq(stat(test_path("other.png"), &sb), 0);
    ck_assert_int_eq(fio_note_input(test_path("other.png"), &sb), MS_OK);
    ck_assert_int_eq(fio_check_output(test_path("other.png")), MS_ERR_ARG);
    /* nothing that is not a regular file is replaced */
    ck_assert_int_eq(mkfifo(test_path("out.fifo"), 0666), 0);
    ck_assert_int_eq(fio_write_file(test_path("out.fifo"), "x", 1), MS_ERR_IO);
    assert_error_names(test_path("out.fifo"), "not a regular file");
    ck_assert_int_eq(fio_write_file(test_path("d"), "x", 1), MS_ERR_IO);
    fio_forget_inputs();
    ck_assert_int_eq(fio_check_output(test_path("x.png")), MS_OK);
}
END_TEST

START_TEST(atomic_write_long_names)
{
    /* 255 bytes, the limit: a suffix on the name would not fit, a short
     * temporary name in the same folder does */
    char name[256];
    memset(name, 'n', 251);
    memcpy(name + 251, ".png", 5);
    const char *p = test_path(name);
    ck_assert_int_eq(fio_write_file(p, "abc", 3), MS_OK);
    size_t n;
    uint8_t *b = read_bytes(p, &n);
    ck_assert_uint_eq(n, 3);
    free(b);
    /* 256 bytes: refused before any work, with the usual words */
    char longer[300];
    snprintf(longer, sizeof longer, "%sx", name);
    ck_assert_int_eq(fio_check_output(test_path(longer)), MS_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "File name too long"));
    ck_assert_int_eq(count_temps(test_dir), 0);
    /* an aborted write leaves the old file and no temporary */
    fio_atomic a;
    ck_assert_int_eq(fio_atomic_begin(&a, p), MS_OK);
    ck_assert_uint_le(strlen(strrchr(a.tmp, '/') + 1), 50);
    fputs("partial", a.f);
    fio_atomic_abort(&a);
    b = read_bytes(p, &n);
    ck_assert_mem_eq(b, "abc", 3);
    free(b);
    ck_assert_int_eq(count_temps(test_dir), 0);
    /* what a signal handler does: the temporaries being written go */
    ck_assert_int_eq(fio_atomic_begin(&a, test_path("y.png")), MS_OK);
    ck_assert_int_eq(count_temps(test_dir), 1);
    fio_remove_live_temps();
    ck_assert_int_eq(count_temps(test_dir), 0);
    fio_atomic_abort(&a);
}
END_TEST

/* A process killed mid-write (here: one that exits without committing)
 * leaves its temporary; the next one removes it, and only it. */
START_TEST(stale_temps_of_dead_processes_removed)
{
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        fio_atomic a;
        if (fio_atomic_begin(&a, test_path("m.png")) != MS_OK) _exit(1);
        fputs("half", a.f);
        fflush(a.f);
        _exit(0); /* as if killed: no commit, no abort */
    }
    int status;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_int_eq(count_temps(test_dir), 1);
    /* ours, alive: kept; another program's look-alike: kept */
    fio_atomic mine;
    ck_assert_int_eq(fio_atomic_begin(&mine, test_path("n.png")), MS_OK);
    write_bytes(test_path("m.png.tmp-1"), "x", 1);
    write_bytes(test_path(".mitaseg-zz-1-1.tmp"), "x", 1);
    ck_assert(!fio_is_temp_name(".mitaseg-zz-1-1.tmp"));
    ck_assert(fio_is_temp_name(strrchr(mine.tmp, '/') + 1));
    /* our own name with another boot id: a process before a reboot that
     * had our PID; stale although the PID runs */
    char other_boot[600];
    snprintf(other_boot, sizeof other_boot, "%s", mine.tmp);
    char *boot = strstr(other_boot, "/.mitaseg-") + strlen("/.mitaseg-") + 9;
    memcpy(boot, boot[0] == '0' ? "1badb007" : "0badb007", 8);
    write_bytes(other_boot, "x", 1);
    ck_assert_int_eq(fio_remove_stale_temps(test_dir), 2);
    ck_assert_int_ne(access(other_boot, F_OK), 0);
    ck_assert_int_eq(access(mine.tmp, F_OK), 0);
    ck_assert_int_eq(access(test_path("m.png.tmp-1"), F_OK), 0);
    ck_assert_int_eq(access(test_path(".mitaseg-zz-1-1.tmp"), F_OK), 0);
    ck_assert_int_eq(fio_atomic_commit(&mine), MS_OK);
    ck_assert_int_eq(access(test_path("n.png"), F_OK), 0);
}
END_TEST

/* A temporary name taken already (a process of an earlier boot had our PID)
 * is skipped, not an error, and the file under it is left alone. */
START_TEST(temp_name_taken)
{
    fio_atomic a;
    ck_assert_int_eq(fio_atomic_begin(&a, test_path("t.png")), MS_OK);
    char next[600];
    snprintf(next, sizeof next, "%s", a.tmp);
    fio_atomic_abort(&a);
    char *num = strrchr(next, '-') + 1; /* "...-PID-SEQ.tmp": the following SEQ */
    snprintf(num, sizeof next - (size_t)(num - next), "%ld.tmp", atol(num) + 1);
    write_bytes(next, "old", 3);
    ck_assert_int_eq(fio_atomic_begin(&a, test_path("t.png")), MS_OK);
    ck_assert_str_ne(a.tmp, next);
    ck_assert_int_eq(fio_atomic_commit(&a), MS_OK);
    size_t n;
    uint8_t *b = read_bytes(next, &n);
    ck_assert_mem_eq(b, "old", 3);
    free(b);
}
END_TEST

START_TEST(id_sets)
{
    fio_id_set s;
    fio_id_set_init(&s);
    for (int i = 0; i < 5000; i++) ck_assert_int_eq(fio_id_set_add(&s, (dev_t)(i % 3), (ino_t)i, i, NULL), 1);
    int old = -1;
    ck_assert_int_eq(fio_id_set_add(&s, 1, 4, 99, &old), 0);
    ck_assert_int_eq(old, 4);
    for (int i = 0; i < 5000; i++) ck_assert_int_eq(fio_id_set_find(&s, (dev_t)(i % 3), (ino_t)i), i);
    ck_assert_int_eq(fio_id_set_find(&s, 2, 4), -1);
    ck_assert_uint_eq(s.n, 5000);
    fio_id_set_free(&s);
    ck_assert_int_eq(fio_id_set_find(&s, 0, 0), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("file_io");
    TCase *tc = tcase_create("file_io");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, fifo_and_devices_refused_without_blocking);
    tcase_add_test(tc, inputs_refused_however_spelled);
    tcase_add_test(tc, atomic_write_long_names);
    tcase_add_test(tc, stale_temps_of_dead_processes_removed);
    tcase_add_test(tc, temp_name_taken);
    tcase_add_test(tc, id_sets);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
