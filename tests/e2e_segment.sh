#!/usr/bin/env bash
# End-to-end tests of `mitaseg segment` (and `info`): every input form, every
# output format, --overlay, --dump, --skip-existing, a corrupt file in the
# middle, inputs never overwritten, sharding, tiling and interrupted runs.
#
# Needs $MS_BIN (the program) and a small model: $MS_TEST_MODEL, else the
# first tests/fixtures/*.model.safetensors. Exit 77 (skipped) without one, or
# without Python 3 with PIL and numpy (used to make and check images).
set -u

. "$(dirname "$0")/common_e2e.sh"
seg() { "$BIN" segment --threads 1 "$@"; }

# ---- helpers in Python (tests/e2e_images.py): make inputs, check outputs ----
h() { "$PY" "$HELPER" "$@"; }

# ---- inputs ------------------------------------------------------------------
h img in/a.png 64 48 1
h img in/b.jpg 40 30 2
h img in/sub/c.png 50 34 3 L
h img in/sub/deep/d.jpg 33 21 4
echo "not an image" > in/notes.txt

# ---- help and usage ------------------------------------------------------------
for c in segment eval info; do
    check "$c --help exits 0 on stdout" bash -c "'$BIN' $c --help | grep -q usage"
done
"$BIN" segment in/a.png >/dev/null 2>&1; check "no -o: usage error 2" test $? -eq 2
"$BIN" segment in/a.png -o o --format jpeg >/dev/null 2>&1; check "bad --format: 2" test $? -eq 2
"$BIN" segment in/a.png -o o --shard 0/2 >/dev/null 2>&1; check "bad --shard: 2" test $? -eq 2
"$BIN" segment in/a.png -o o --frobnicate >/dev/null 2>&1; check "unknown option: 2" test $? -eq 2
# --devices needs GPUs: where the build or machine has fewer than listed, a
# one-line error with exit 2 before any work (no output folder made); where
# they exist, the masks are written.
for d in 0 0,1; do
    "$BIN" segment in/a.png in/b.jpg -o "o_dev$d" --devices "$d" 2>err.txt >/dev/null
    rc=$?
    if [ $rc -eq 0 ]; then
        check "--devices $d on GPUs: masks written" bash -c \
            "'$PY' '$HELPER' index_ok o_dev$d/a.png in/a.png '$MODEL' && '$PY' '$HELPER' index_ok o_dev$d/b.png in/b.jpg '$MODEL'"
    else
        check "--devices $d without the GPUs: 2, one line naming --devices, nothing written" \
            bash -c "test $rc -eq 2 && test \$(wc -l < err.txt) -eq 1 && grep -q -- '--devices' err.txt && [ ! -e o_dev$d ]"
    fi
done
"$BIN" segment in/a.png -o o_dev --device cpu --devices 0 2>err.txt >/dev/null
check "--devices with --device cpu: usage error 2" bash -c "test $? -eq 2 && grep -q 'device cpu' err.txt"
"$BIN" segment in/a.png -o o_dev --devices 0,0 2>err.txt >/dev/null
check "--devices 0,0: usage error 2" bash -c "test $? -eq 2 && grep -q 'twice' err.txt"

# ---- info -----------------------------------------------------------------------
"$BIN" info "$MODEL" > info.txt 2>&1
check "info exits 0" test $? -eq 0
check "info prints config, grid, params, tensor table" bash -c \
    "grep -q '\"backbone\"' info.txt && grep -q 'tokens' info.txt && grep -q 'parameters' info.txt && grep -q 'decode_head.conv_seg.weight' info.txt"
"$BIN" info /nonexistent.safetensors >/dev/null 2>&1; check "info on a missing file: 1" test $? -eq 1
if [ -f "$FIX/stem_skips.model.safetensors" ]; then
    "$BIN" info "$FIX/stem_skips.model.safetensors" > info_sk.txt 2>&1
    check "info names the neck's stem skips and their tensors" bash -c \
        "grep -q 'levels 0-1 add the conv stem' info_sk.txt && grep -q 'neck.stem_convs.1.conv.weight' info_sk.txt && ! grep -q 'add the conv stem' info.txt"
fi

# ---- input forms ----------------------------------------------------------------
seg in/a.png in/b.jpg -o o_files 2>err.txt
check "files: exit 0" test $? -eq 0
check "files: index PNG, input size, model palette" h index_ok o_files/a.png in/a.png "$MODEL"
check "files: JPEG input" h index_ok o_files/b.png in/b.jpg "$MODEL"
check "summary line" grep -q "segmented 2 images, 0 failed, 0 skipped" err.txt

seg in -o o_dir -q 2>err.txt
check "folder: only its own images" bash -c "[ -f o_dir/a.png ] && [ -f o_dir/b.png ] && [ ! -e o_dir/sub ] && [ ! -e o_dir/notes.png ]"
check "--quiet: no summary" test ! -s err.txt
seg -r in -o o_rec -q
check "-r: sub-folders mirrored" bash -c "[ -f o_rec/sub/c.png ] && [ -f o_rec/sub/deep/d.png ] && [ -f o_rec/a.png ]"
check "-r: grey input" h index_ok o_rec/sub/c.png in/sub/c.png "$MODEL"
check "same image, same mask" h same_ids o_rec/a.png o_files/a.png

printf 'a.png\n# comment\n\nsub/deep/d.jpg\n' > in/list.txt
seg --list in/list.txt -o o_list -q
check "--list: relative to the list, sub-folders kept" bash -c "[ -f o_list/a.png ] && [ -f o_list/sub/deep/d.png ]"
printf 'in/b.jpg\n%s\n' "$T/in/sub/c.png" | seg - -o o_stdin -q
check "stdin: relative path mirrored, absolute by base name" bash -c "[ -f o_stdin/in/b.png ] && [ -f o_stdin/c.png ]"
find "$T/in" -name '*.png' | seg - -o o_find -q
check "stdin from find (absolute): mirrored below the shared folder" bash -c "[ -f o_find/a.png ] && [ -f o_find/sub/c.png ]"

# ---- formats, overlay, dump ---------------------------------------------------------
seg in/a.png -o o_label --format label -q
check "--format label: grey ids equal the index mask" h label_ok o_label/a.png o_files/a.png
seg in/a.png -o o_color --format color --overlay -q
check "--format color: palette colours" h color_ok o_color/a.png o_files/a.png "$MODEL"
check "--overlay: 50% blend" h overlay_ok o_color/a.overlay.png in/a.png o_files/a.png "$MODEL"
seg in/a.png -o o_dump --dump a.safetensors -q
check "--dump: logits, mask = PNG = argmax, MiTA layers" h dump_ok a.safetensors o_dump/a.png "$MODEL"
seg in/a.png -o o_heat --heatmaps --attention mita -q 2>err.txt
rc=$?
if grep -q "not available in this build" err.txt; then
    echo "note: no headless renderer in this build; --heatmaps not exercised"
else
    check "--heatmaps: exit 0" test $rc -eq 0
    check "--heatmaps: NAME.heatmaps.png decodes" h decodes o_heat/a.heatmaps.png
    seg in/a.png -o o_heat2 --heatmaps --attention full -q 2>/dev/null
    check "--heatmaps with full attention: usage error" test $? -eq 2
fi
"$BIN" segment in/a.png in/b.jpg --dump x.safetensors >/dev/null 2>&1
check "--dump with two images: refused" test $? -eq 2

# --short-side: the run of a model whose input.short_side says the same
# (logits, mask and MiTA record bit for bit); native = no resize at all
h recfg "$MODEL" ss24.model.safetensors '{"input.short_side": 24}'
h recfg "$MODEL" ssnat.model.safetensors '{"input.short_side": null}'
seg in/a.png --dump ss_opt.safetensors --short-side 24 -q
seg in/a.png --dump ss_cfg.safetensors --model ss24.model.safetensors -q
check "--short-side 24 = a model with input.short_side 24" h dumps_same ss_opt.safetensors ss_cfg.safetensors 1
check "--short-side 24 differs from the model's own size" h dumps_same ss_opt.safetensors a.safetensors 0
check "--dump names the working size and token grid (24x32 at --short-side 24)" h dump_geometry ss_opt.safetensors 24x32
seg in/a.png --dump ssn_opt.safetensors --short-side native -q
seg in/a.png --dump ssn_cfg.safetensors --model ssnat.model.safetensors -q
check "--short-side native = a model without input.short_side" h dumps_same ssn_opt.safetensors ssn_cfg.safetensors 1
seg in/a.png in/b.jpg -o o_ss --short-side 24 -q
check "--short-side: masks at the image's size" bash -c "'$PY' '$HELPER' index_ok o_ss/a.png in/a.png '$MODEL' && '$PY' '$HELPER' index_ok o_ss/b.png in/b.jpg '$MODEL'"
"$BIN" segment in/a.png -o o_ssmem --short-side 4096 --max-memory 64M >/dev/null 2>err.txt
check "--short-side 4096: the memory budget sees the working size, refused before the run" bash -c \
    "test $? -eq 1 && grep -Eq 'network input 54[0-9][0-9]x4096' err.txt && grep -q 'max-memory' err.txt && [ ! -e o_ssmem/a.png ]"
for bad in 0 4097 -3 12x abc ""; do
    "$BIN" segment in/a.png -o o_ssbad --short-side "$bad" >/dev/null 2>err.txt
    check "--short-side '$bad': usage error 2, one line naming it" bash -c \
        "test $? -eq 2 && grep -q \"short-side: expected 1..4096 or native, got '$bad'\" err.txt && [ \$(wc -l < err.txt) -eq 1 ]"
done

# ---- tiles ----------------------------------------------------------------------------
seg in/a.png -o o_tile1 --tile 64 --overlap 0 -q
check "--tile covering the image = untiled" h same_ids o_tile1/a.png o_files/a.png
seg in/a.png -o o_tile --tile 32 --overlap 8 -q
check "--tile 32 --overlap 8: mask at the input size" h index_ok o_tile/a.png in/a.png "$MODEL"

# ---- skip-existing ----------------------------------------------------------------------
cp -r o_files o_skip
touch -d '2001-01-01' o_skip/a.png
rm o_skip/b.png
echo partial > o_skip/b.png.tmp-99999      # a killed run's temp file
seg in/a.png in/b.jpg -o o_skip --skip-existing 2>err.txt
check "--skip-existing: 1 done, 1 skipped" grep -q "segmented 1 image, 0 failed, 1 skipped" err.txt
check "--skip-existing: existing output untouched" test "$(stat -c %Y o_skip/a.png)" = "$(date -d 2001-01-01 +%s)"
check "--skip-existing: a temp file is not an output" h index_ok o_skip/b.png in/b.jpg "$MODEL"

# ---- a corrupt file in the middle ---------------------------------------------------------
mkdir -p bad
h img bad/1.png 48 32 5
h img bad/3.png 48 32 6
h truncate bad/1.png bad/2.png 60
echo "garbage" > bad/4.jpg
seg bad -o o_bad 2>err.txt
rc=$?
check "corrupt files: exit 1" test $rc -eq 1
check "corrupt files: each named on one line" bash -c "grep -q '^mitaseg: bad/2.png: ' err.txt && grep -q '^mitaseg: bad/4.jpg: ' err.txt"
check "corrupt files: the others written" h decodes o_bad/1.png o_bad/3.png
check "corrupt files: no partial outputs" bash -c "[ ! -e o_bad/2.png ] && [ ! -e o_bad/4.png ] && [ -z \"\$(ls o_bad | grep tmp)\" ]"
check "corrupt files: summary counts" grep -q "segmented 2 images, 2 failed" err.txt
seg in/a.png nope.png -o o_missing 2>err.txt
check "missing input: named, others done, exit 1" bash -c "test $? -eq 1 && grep -q 'nope.png' err.txt && [ -f o_missing/a.png ]"

# ---- inputs are never overwritten -------------------------------------------------------------
mkdir -p same
cp in/a.png same/x.png
h img same/y.jpg 20 20 7
cp same/y.jpg same/z.jpg
cp in/a.png same/z.png
sum_before=$(md5sum same/x.png same/z.png)
seg same -o same 2>err.txt
rc=$?
check "-o = input folder: exit 1" test $rc -eq 1
check "-o = input folder: input PNGs unchanged" test "$sum_before" = "$(md5sum same/x.png same/z.png)"
check "-o = input folder: reason given" grep -q "would overwrite the input" err.txt
check "-o = input folder: the JPEG without a twin done" h index_ok same/y.png same/y.jpg "$MODEL"
seg same -o same_out -q 2>err.txt
check "a.jpg + a.png -> one name: second refused, named" bash -c "test $? -eq 1 && grep -q 'also the output of' err.txt"
rm -f same/y.png

# ---- --batch: same-size runs in one forward pass ------------------------------------------------
# Five 40x30 images around one 33x21 (sorted order b1 b2 b3 b4* b5 b6), so
# batches of 3 are {b1 b2 b3} {b4} {b5 b6}: a size change and a short tail.
mkdir -p bat
for i in 1 2 3 5 6; do h img bat/b$i.png 40 30 $((40 + i)); done
h img bat/b4.png 33 21 44
seg bat -o o_b1 -q; check "--batch 1 run: exit 0" test $? -eq 0
seg bat -o o_b3 --batch 3 2>err.txt; check "--batch 3 run: exit 0" test $? -eq 0
check "--batch 3: all 6 segmented" grep -q "segmented 6 images, 0 failed" err.txt
check "--batch 3: index PNGs at each input's size" bash -c \
    "for i in 1 2 3 4 5 6; do '$PY' '$HELPER' index_ok o_b3/b\$i.png bat/b\$i.png '$MODEL' || exit 1; done"
# Batched logits equal single-image ones up to GEMM rounding (~1e-6 relative,
# tests/test_batch_engine.c), so a mask pixel can flip only at a near-tie:
# allow 0.5% of the pixels, far below what a wrong image or slice changes.
check "--batch 3 masks = --batch 1 masks (near-ties aside)" "$PY" -c '
import sys, numpy as np
from PIL import Image
bad = 0
for i in (1, 2, 3, 4, 5, 6):
    a = np.asarray(Image.open("o_b1/b%d.png" % i)); b = np.asarray(Image.open("o_b3/b%d.png" % i))
    if a.shape != b.shape or (a != b).mean() > 0.005: print("b%d differs" % i); bad = 1
sys.exit(bad)'
seg bat -o o_bt1 --tile 24 -q && seg bat -o o_bt3 --tile 24 --batch 3 -q
check "--batch with --tile: windows run one at a time, same masks" bash -c \
    "for i in 1 2 3 4 5 6; do '$PY' '$HELPER' same_ids o_bt1/b\$i.png o_bt3/b\$i.png || exit 1; done"

# ---- sharding ------------------------------------------------------------------------------------
mkdir -p many
for i in $(seq -w 1 11); do h img many/img$i.png 24 16 $((10 + 10#$i)); done
for s in 1 2 3; do seg many -o "o_shard$s" --shard $s/3 -q || bad "shard $s/3 run"; done
all=$(cd many && ls | sort)
union=$(for s in 1 2 3; do (cd "o_shard$s" && ls); done | sort)
dups=$(for s in 1 2 3; do (cd "o_shard$s" && ls); done | sort | uniq -d)
check "shards cover the inputs" test "$all" = "$union"
check "shards are disjoint" test -z "$dups"
check "shard 1/3 is positions 0, 3, 6, 9" test "$(cd o_shard1 && ls | tr '\n' ' ')" = "img01.png img04.png img07.png img10.png "

# ---- interrupted runs ------------------------------------------------------------------------------
# Many copies of a large-ish image, one thread: slow enough to interrupt.
mkdir -p big
h img big/src.png 480 360 99
for i in $(seq -w 1 120); do cp big/src.png big/im$i.png; done
rm big/src.png
interrupt() { # interrupt SIGNAL OUTDIR -> exit status of the killed run
    "$BIN" segment big -o "$2" --threads 1 -q 2>/dev/null &
    local pid=$! n=0
    for _ in $(seq 1 600); do
        n=$(ls "$2" 2>/dev/null | grep -c '\.png$')
        [ "$n" -ge 2 ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    kill -"$1" $pid 2>/dev/null
    { wait $pid; } 2>/dev/null
}
interrupt INT o_int
rc=$?
n=$(ls o_int | grep -c '\.png$')
if [ "$n" -lt 120 ]; then
    check "SIGINT: exit 130" test $rc -eq 130
    check "SIGINT: every .png decodes ($n written)" h decodes o_int/*.png
    check "SIGINT: no temp files left" bash -c "[ -z \"\$(ls -A o_int | grep -v '\.png$')\" ]"
else
    echo "note: the run finished before SIGINT; interrupt checks not exercised"
fi
interrupt KILL o_kill
n=$(ls o_kill | grep -c '\.png$')
if [ "$n" -lt 120 ]; then
    check "SIGKILL: every .png decodes ($n written)" h decodes o_kill/*.png
    check "SIGKILL: temp names are hidden, never .png" bash -c "! ls -A o_kill | grep -v '\.png$' | grep -qv '^\.mitaseg-.*\.tmp$'"
    seg big -o o_kill --skip-existing -q
    check "resume after SIGKILL: all 120 written and whole" bash -c \
        "[ \$(ls o_kill | grep -c '\.png$') -eq 120 ] && '$PY' '$HELPER' decodes o_kill/*.png"
    check "resume after SIGKILL: the killed run's temporaries removed" bash -c "[ -z \"\$(ls -A o_kill | grep tmp)\" ]"
else
    echo "note: the run finished before SIGKILL; kill checks not exercised"
fi

echo "$pass passed, $fails failed"
[ $fails -eq 0 ]
