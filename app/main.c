/* mitaseg: segment images with a MiTA-backbone UperNet, batch them, evaluate,
 * and look inside the model's expert selections. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "file_io.h"

static const char usage[] =
    "usage: mitaseg <command> [options]\n"
    "\n"
    "commands:\n"
    "  view [IMAGE]            open the viewer (segmentation + expert selections)\n"
    "  segment INPUT... -o DIR write one PNG mask per image (files, folders, lists)\n"
    "  eval --list FILE        mIoU against labels\n"
    "  render IMAGE -o OUT.png draw one viewer view headless\n"
    "  info [MODEL]            print a model's config and tensor table\n"
    "  doctor                  check this machine: CPU, GPUs, and a self-test of every op\n"
    "\n"
    "`mitaseg <command> --help` describes each command.\n";

int main(int argc, char **argv)
{
    cli_interrupt_init();
    fio_remember_inputs(true); /* no command writes over a file it read */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "segment")) return cmd_segment(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "doctor")) return cmd_doctor(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "view")) return cmd_view(argc - 1, argv + 1);
    if (!strcmp(cmd, "render")) return cmd_render(argc - 1, argv + 1);
    cli_error("unknown command '%s' (see mitaseg --help)", cmd);
    return 2;
}
