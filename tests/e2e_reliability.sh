#!/usr/bin/env bash
# What mitaseg promises about inputs, outputs and interruption, tried as a
# hostile user would (README: "What mitaseg promises about inputs, outputs
# and interruption"): no input is ever overwritten however the output is
# spelled; FIFOs and devices are refused, never waited on; symlink loops end;
# every list line is processed or reported; long legal names work; SIGINT and
# SIGTERM end any run within a second with 130/143 and no temporary file;
# temporaries of killed runs are removed by the next run; clear errors.
# Needs $MS_BIN and a small model (see common_e2e.sh); exit 77 without one.
set -u

. "$(dirname "$0")/common_e2e.sh"
h() { "$PY" "$HELPER" "$@"; }
# A copy: the tests try to overwrite the model, and a broken build must not
# destroy the fixture.
cp "$MODEL" model.safetensors
MODEL=$T/model.safetensors
export MITASEG_MODEL=$MODEL
M=(--device cpu --threads 1 --model "$MODEL")
seg() { "$BIN" segment "${M[@]}" "$@"; }

h img in/a.png 64 48 1
h img in/b.png 40 30 2
h img in/c.jpg 48 40 3
have_render=1
"$BIN" render --help >/dev/null 2>&1 || have_render=0

# ---- 1. no input is ever overwritten, however the output is spelled ----------------------
sum() { md5sum "$@" | cut -d' ' -f1 | tr '\n' ' '; }
before=$(sum in/a.png "$MODEL")
seg in/a.png --dump in/a.png 2>err.txt
check "--dump onto the input image: refused" bash -c "test $? -ne 0 && grep -q 'would overwrite the input' err.txt"
seg in/a.png --dump in/../in/./a.png 2>/dev/null
check "--dump onto in/../in/./a.png: refused" test $? -ne 0
seg in/a.png --dump "$MODEL" 2>err.txt
check "--dump onto the model: refused" bash -c "test $? -ne 0 && grep -q 'would overwrite the input' err.txt"
check "--dump: image and model unchanged" test "$before" = "$(sum in/a.png "$MODEL")"
ln -s in/a.png link.png
ln in/a.png hard.png
seg in/a.png --dump link.png 2>/dev/null
check "--dump onto a symlink to the input: refused" bash -c "test $? -ne 0 && [ -L link.png ] && [ -f link.png ]"
seg in/a.png --dump hard.png 2>/dev/null
check "--dump onto a hard link of the input: refused" test $? -ne 0
check "--dump: input unchanged after every spelling" test "$before" = "$(sum in/a.png "$MODEL")"
mkdir -p o_link && ln -s ../in/a.png o_link/a.png
seg in/a.png -o o_link 2>err.txt
check "mask onto a symlink to its input: refused" bash -c "test $? -eq 1 && grep -q 'would overwrite the input' err.txt"
if [ $have_render = 1 ]; then
    bsum=$(sum in/b.png)
    "$BIN" render "${M[@]}" in/b.png -o in/b.png 2>err.txt
    check "render -o the input: refused" bash -c "test $? -ne 0 && grep -q 'would overwrite the input' err.txt"
    "$BIN" render "${M[@]}" in/b.png -o ./in/../in/b.png 2>/dev/null
    check "render -o ./in/../in/b.png: refused" test $? -ne 0
    "$BIN" render "${M[@]}" in/b.png -o "$MODEL" 2>/dev/null
    check "render -o the model: refused" test $? -ne 0
    check "render: input unchanged" test "$bsum" = "$(sum in/b.png)"
    mkfifo out_fifo
    timeout 20 "$BIN" render "${M[@]}" in/b.png -o out_fifo 2>err.txt
    check "render -o a FIFO: refused, the FIFO stays" bash -c "test $? -ne 0 && [ -p out_fifo ] && grep -q 'not a regular file' err.txt"
fi
mkdir -p ev/img ev/lab
cp in/a.png ev/img/a.png
"$PY" -c "from PIL import Image; Image.new('L', (64, 48), 1).save('ev/lab/a.png')"
printf 'img/a.png lab/a.png\n' > ev/list.txt
lsum=$(sum ev/lab/a.png ev/list.txt)
"$BIN" eval "${M[@]}" -q --list ev/list.txt --json ev/lab/a.png >out.txt 2>err.txt
check "eval --json onto a label: refused before the run" bash -c "test $? -ne 0 && grep -q 'would overwrite the input' err.txt && ! grep -q mIoU out.txt"
"$BIN" eval "${M[@]}" -q --list ev/list.txt --json ev/list.txt >/dev/null 2>&1
check "eval --json onto the list: refused" test $? -ne 0
"$BIN" eval "${M[@]}" -q --list ev/list.txt --json "$MODEL" >out.txt 2>err.txt
check "eval --json onto the model: refused before the run" bash -c "test $? -ne 0 && grep -q 'would overwrite the input' err.txt && ! grep -q mIoU out.txt"
check "eval: label, list and model unchanged" test "$lsum $before" = "$(sum ev/lab/a.png ev/list.txt) $(sum in/a.png "$MODEL")"

# ---- 2. FIFOs and devices: refused at once, never waited on ----------------------------------
mkfifo fifo.png fifo.model
timeout 10 "$BIN" segment "${M[@]}" fifo.png -o o_fifo 2>err.txt
check "segment FIFO: one line, exit 1, no hang" bash -c "test $? -eq 1 && grep -q '^mitaseg: fifo.png: not a regular file (a FIFO)' err.txt"
timeout 10 "$BIN" info fifo.model 2>err.txt >/dev/null
check "info FIFO: exit 1, no hang" bash -c "test $? -eq 1 && grep -q 'not a regular file' err.txt"
timeout 10 "$BIN" segment --device cpu --model fifo.model in/a.png -o o_fifo 2>err.txt
check "--model FIFO: exit 1, no hang" bash -c "test $? -eq 1 && grep -q 'fifo.model: not a regular file' err.txt"
printf 'in/a.png\nfifo.png\n/dev/zero\nin/b.png\n' > fifo_list.txt
timeout 10 "$BIN" segment "${M[@]}" --list fifo_list.txt -o o_fifo 2>err.txt
check "FIFO and device in --list: reported, the others done" bash -c \
    "test $? -eq 1 && grep -q 'fifo.png: not a regular file' err.txt && grep -q '/dev/zero: not a regular file' err.txt && [ -f o_fifo/in/a.png ] && [ -f o_fifo/in/b.png ]"
printf 'fifo.png lab/a.png\n' > ev/fifo.txt && mv fifo.png ev/
timeout 10 "$BIN" eval "${M[@]}" -q --list ev/fifo.txt >/dev/null 2>err.txt
check "eval with a FIFO image: reported, no hang" bash -c "test $? -eq 1 && grep -q 'not a regular file' err.txt"
# a list that is a pipe (process substitution) is fine
timeout 20 "$BIN" segment "${M[@]}" -q --list <(echo "$T/in/a.png") -o o_pipe
check "--list <(...): a pipe is a list" test -f o_pipe/a.png

# ---- interruption: any run ends within a second, 130/143, nothing partial --------------------
# One image in 16-pixel windows takes many seconds (3000 x 3000: about 6 s
# on one thread), more than the half second the image in flight gets: only
# the hard stop ends it in time, so nothing is finished.
h img slow/big.png 3000 3000 5
check "SIGTERM mid-image: exit 143 within a second" h sigrun TERM 1.5 1 \
    "$BIN" segment "${M[@]}" -q slow/big.png --tile 16 -o o_sig
check "SIGINT mid-image: exit 130 within a second" h sigrun INT 1.5 1 \
    "$BIN" segment "${M[@]}" -q slow/big.png --tile 16 -o o_sig
check "SIGHUP (terminal closed) mid-image: exit 129 within a second" h sigrun HUP 1.5 1 \
    "$BIN" segment "${M[@]}" -q slow/big.png --tile 16 -o o_sig
check "interrupted mid-image: no partial mask, no temporary" bash -c "[ ! -e o_sig/big.png ] && [ -z \"\$(find o_sig -name '*.tmp*' 2>/dev/null)\" ]"
mkdir -p ev/slow/img ev/slow/lab
cp slow/big.png ev/slow/img/big.png
"$PY" -c "from PIL import Image; Image.new('L', (3000, 3000), 1).save('ev/slow/lab/big.png')"
check "eval: SIGTERM mid-image: exit 143 within a second" h sigrun TERM 1.5 1 \
    "$BIN" eval "${M[@]}" -q --images ev/slow/img --labels ev/slow/lab --tile 16 --json ev_sig.json
check "eval interrupted: no JSON, no temporary" bash -c "[ ! -e ev_sig.json ] && [ -z \"\$(ls -A | grep tmp)\" ]"
# a list read from a pipe that never ends
mkfifo never
sleep 30 > never &
holder=$!
check "SIGTERM while reading a list: exit 143 within a second" h sigrun TERM 1 1 \
    "$BIN" segment "${M[@]}" --list never -o o_never
kill $holder 2>/dev/null

# ---- 3. symlink loops under -r -------------------------------------------------------------
h img tree/b.png 24 16 8
h img tree/sub/a.png 24 16 9
ln -s . tree/sub/loop
ln -s ../ tree/sub/up
timeout 20 "$BIN" segment "${M[@]}" -r tree -o o_tree 2>err.txt
rc=$?
check "-r with loop -> . and up -> ../: ends, exit 0" test $rc -eq 0
check "-r with loops: each file segmented once" test "$(find o_tree -name '*.png' | sort | tr '\n' ' ')" = "o_tree/b.png o_tree/sub/a.png "
mkdir -p tree/empty/deeper
timeout 20 "$BIN" segment "${M[@]}" -q -r tree -o o_tree2
check "-r with empty sub-folders: exit 0" test $? -eq 0

# ---- 5. a NUL byte in a list or on stdin: every line processed or reported --------------------
h img nul/grey8.png 24 16 10 L
h img nul/rgb8.png 24 16 11
printf 'grey8.png\nbad\0name.png\nrgb8.png\n' > nul/list.txt
seg --list nul/list.txt -o o_nul 2>err.txt
rc=$?
check "NUL in --list: exit 1, the line reported" bash -c "test $rc -eq 1 && grep -q 'list.txt:2: NUL byte' err.txt"
check "NUL in --list: the lines after it still done" bash -c "[ -f o_nul/grey8.png ] && [ -f o_nul/rgb8.png ]"
printf 'nul/grey8.png\nbad\0name.png\nnul/rgb8.png\n' | seg - -o o_nul2 2>err.txt
rc=$?
check "NUL on stdin: reported, later lines done" bash -c \
    "test $rc -eq 1 && grep -q 'standard input:2: NUL byte' err.txt && [ -f o_nul2/nul/rgb8.png ]"

# ---- 6. legal long names ----------------------------------------------------------------------
long=$(printf 'x%.0s' $(seq 1 251))   # 251 + ".png" = 255 bytes, the limit
h img "long/$long.png" 24 16 12
seg "long/$long.png" -o o_long 2>err.txt
check "255-byte file name: segmented" bash -c "test $? -eq 0 && [ -f 'o_long/$long.png' ]"
seg "long/$long.png" -o o_long2 --overlay 2>err.txt
check "overlay name past 255 bytes: one clear line, nothing left" bash -c \
    "test $? -eq 1 && grep -q 'File name too long' err.txt && [ -z \"\$(ls -A o_long2 2>/dev/null | grep tmp)\" ]"

# ---- 9. temporaries of killed runs are removed by the next run ---------------------------------
sh -c 'exit 0' & dead=$!; wait $dead
mkdir -p o_stale/sub
stale=$(h temp_name $dead 1)
live=$(h temp_name $$ 1)
# a power loss: the temporary of an earlier boot, whose PID now runs again
old_boot=$(h temp_name $$ 2 0badb007)
echo partial > "o_stale/$stale"
echo partial > "o_stale/sub/$stale"
echo mine > "o_stale/$live"
echo partial > "o_stale/$old_boot"
echo theirs > o_stale/a.png.tmp-12345
mkdir -p in_stale/sub && cp in/a.png in_stale/ && cp in/b.png in_stale/sub/
seg -q -r in_stale -o o_stale
check "stale temporaries of dead runs removed" bash -c "[ ! -e 'o_stale/$stale' ] && [ ! -e 'o_stale/sub/$stale' ]"
check "an earlier boot's temporary removed, though its PID runs now" test ! -e "o_stale/$old_boot"
check "a live run's temporary and other programs' files kept" bash -c "[ -e 'o_stale/$live' ] && [ -e o_stale/a.png.tmp-12345 ]"

# ---- 12. smaller: errors that are errors, clear messages -----------------------------------------
mkdir -p ev/oor
"$PY" -c "from PIL import Image; Image.new('L', (64, 48), 200).save('ev/oor/a.png')"
printf 'img/a.png oor/a.png\n' > ev/oor.txt
"$BIN" eval "${M[@]}" -q --list ev/oor.txt >out.txt 2>err.txt
check "eval: every label pixel out of range is an error" bash -c "test $? -eq 1 && grep -q 'no labelled pixel' err.txt"
echo file > notafolder
seg in/a.png in/b.png -o notafolder/out 2>err.txt
check "segment -o that cannot be made: one line before the run, exit 2" bash -c \
    "test $? -eq 2 && [ \$(wc -l < err.txt) -eq 1 ] && grep -q 'notafolder' err.txt"
"$BIN" eval "${M[@]}" -q --list ev/list.txt --json nodir/x.json >out.txt 2>err.txt
check "eval --json to an unwritable path: fails before the run" bash -c \
    "test $? -ne 0 && grep -q 'nodir/x.json' err.txt && ! grep -q mIoU out.txt"
esc=$(printf 'in/e\033[31mred\tx.png')
echo garbage > "$esc"
seg "$esc" -o o_esc 2>err.txt
check "control characters in a file name are escaped" bash -c \
    "test $? -eq 1 && ! grep -q \$'\\033' err.txt && ! grep -q \$'\\t' err.txt && grep -qF 'e\\x1b[31mred\\tx.png' err.txt"
h recfg "$MODEL" grid.model.safetensors '{"input.short_side": null, "input.pad_multiple": 8}'
h img g8.png 8 8 13
"$BIN" segment --device cpu --model grid.model.safetensors g8.png -o o_grid 2>err.txt
check "too small for the neck: no 'activation memory' prefix" bash -c \
    "test $? -eq 1 && grep -q 'too small for neck level' err.txt && ! grep -q 'activation memory' err.txt"

echo "$pass passed, $fails failed"
[ $fails -eq 0 ]
