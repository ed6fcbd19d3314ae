#!/usr/bin/env bash
# Renamed: tests/gpu/gpu-run.sh (the GPU run, with phases). Kept for the
# notes that name this file.
exec bash "$(dirname "$0")/gpu-run.sh" "$@"
