/* The command line: app/main.c dispatches to one cmd_<name>.c per command.
 * Only these files print or exit. */
#ifndef MS_CLI_H
#define MS_CLI_H

#include <signal.h>
#include <stdio.h>

#include "engine.h"

int cmd_segment(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_view(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_doctor(int argc, char **argv);

/* Options every engine-running command accepts. */
typedef struct {
    const char *model;          /* NULL: the shipped default model */
    ms_engine_options eng;
    ms_run_options run;
} cli_engine_args;

void cli_engine_args_init(cli_engine_args *a);
/* Tries argv[*i] as an engine option (--model, --attention, --landmarks,
 * --topk, --short-side, --device, --threads, --fp32, --max-memory, --tta),
 * consuming its value. Returns 1 when consumed, 0 when not an engine
 * option, -1 on a bad value (message printed). */
int cli_parse_engine_arg(cli_engine_args *a, int argc, char **argv, int *i);
/* Help text for those options, for each command's --help. */
extern const char cli_engine_help[];
/* The model path to use: a->model, else $MITASEG_MODEL, else the shipped one. */
const char *cli_model_path(const cli_engine_args *a);
/* assets/<name> next to the executable's tree (installed or build dir) if
 * readable, else in the source tree; written into buf (n bytes). */
const char *cli_asset_path(char *buf, size_t n, const char *name);
/* Opens the engine; prints the error (and the auto fallback line) itself.
 * Returns 0 on success. */
int cli_open_engine(ms_engine **e, const cli_engine_args *a, bool quiet);
/* image_read that refuses, before decoding, an image whose run on e (with
 * opt; tile > 0: --tile windows of that size) would exceed the engine's
 * memory budget (--max-memory). */
ms_status cli_read_image(ms_image *img, const char *path, ms_engine *e, const ms_run_options *opt,
                         int tile);
/* Monotonic clock in seconds, for timings and progress. */
double cli_now_s(void);
/* Prints "mitaseg: <message>" to stderr, control characters escaped. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fputs with control characters (C0, DEL, C1) written as \n, \t, \xHH, so
 * a file name cannot move the cursor or recolour the terminal. */
void cli_fputs_escaped(const char *s, FILE *f);

/* Interrupts (SIGINT, SIGTERM, SIGHUP): every command ends within a second
 * with exit 128 + the signal (130, 143, 129), after removing the temporary
 * files being written (fio_remove_live_temps), so nothing partial is left.
 * main() installs this for every command, which then ends at once on a
 * signal. A command that calls cli_interrupt_graceful() is told instead (the
 * first signal sets cli_interrupted) and finishes what it is doing, keeping
 * finished outputs; if that takes more than half a second, or at a second
 * signal, the process ends at once all the same. */
extern volatile sig_atomic_t cli_interrupted; /* the signal; 0 while none came */
void cli_interrupt_init(void);
void cli_interrupt_graceful(void);
/* 128 + cli_interrupted: the exit status of an interrupted run. */
int cli_interrupt_status(void);

#endif
