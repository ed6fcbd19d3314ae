/* The command line: app/main.c dispatches to one cmd_<name>.c per command.
 * Only these files print or exit. */
#ifndef MS_CLI_H
#define MS_CLI_H

#include "engine.h"

int cmd_segment(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_view(int argc, char **argv);
int cmd_render(int argc, char **argv);

/* Options every engine-running command accepts. */
typedef struct {
    const char *model;          /* NULL: the shipped default model */
    ms_engine_options eng;
    ms_run_options run;
} cli_engine_args;

void cli_engine_args_init(cli_engine_args *a);
/* Tries argv[*i] as an engine option (--model, --attention, --landmarks,
 * --topk, --device, --threads, --fp32, --tta), consuming its value. Returns 1 when
 * consumed, 0 when not an engine option, -1 on a bad value (message printed). */
int cli_parse_engine_arg(cli_engine_args *a, int argc, char **argv, int *i);
/* Help text for those options, for each command's --help. */
extern const char cli_engine_help[];
/* The model path to use: a->model, else $MITASEG_MODEL, else the shipped one. */
const char *cli_model_path(const cli_engine_args *a);
/* Opens the engine; prints the error (and the auto fallback line) itself.
 * Returns 0 on success. */
int cli_open_engine(ms_engine **e, const cli_engine_args *a, bool quiet);
/* Monotonic clock in seconds, for timings and progress. */
double cli_now_s(void);
/* Prints "mitaseg: <message>" to stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
