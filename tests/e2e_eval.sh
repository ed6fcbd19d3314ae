#!/usr/bin/env bash
# End-to-end tests of `mitaseg eval` on hand-made label sets whose answer is
# known: labels equal to the model's own masks (mIoU 100), labels that are all
# wrong (0), and a mix whose metrics are computed independently in numpy.
# Needs $MS_BIN and a small model (see e2e_segment.sh); exit 77 without one.
set -u

. "$(dirname "$0")/common_e2e.sh"
h() { "$PY" "$HELPER" "$@"; }
ev() { "$BIN" eval --threads 1 -q "$@"; }

h img data/img/a.png 64 48 1
h img data/img/b.png 40 30 2
h img data/img/c.jpg 48 40 3
"$BIN" segment --threads 1 -q data/img -o pred || { echo "FAIL segment"; exit 1; }
mkdir -p data/same data/shift data/mix
for n in a b c; do
    h labels pred/$n.png data/same/$n.png data/shift/$n.png data/mix/$n.png "$MODEL" > expect_$n.json
done
# lists live in data/: paths are relative to the list's folder
printf 'img/a.png same/a.png\nimg/b.png same/b.png\n# comment\n\nimg/c.jpg same/c.png\n' > data/same.txt
printf 'img/a.png shift/a.png\nimg/b.png shift/b.png\n' > data/shift.txt
printf 'img/a.png mix/a.png\n' > data/mix.txt

ev --list data/same.txt --json same.json > out.txt 2>err.txt
check "own masks as labels: exit 0" test $? -eq 0
check "own masks as labels: mIoU 100.00 printed" grep -Eq '^mIoU +100\.00$' out.txt
check "own masks as labels: aAcc, mAcc 100" bash -c "grep -Eq '^aAcc +100\.00$' out.txt && grep -Eq '^mAcc +100\.00$' out.txt"
check "--json: mIoU, aAcc, mAcc 100" h json_close same.json '{"mIoU": 100, "aAcc": 100, "mAcc": 100}'
check "--json: per-class entries" bash -c "'$PY' -c \"import json; d=json.load(open('same.json')); assert len(d['classes']) > 0 and 'IoU' in d['classes'][0] and d['images'] == 3\""
check "timing line" grep -q "3 images evaluated in" out.txt

ev --list data/shift.txt > out.txt 2>&1
check "all-wrong labels: mIoU 0, aAcc 0" bash -c "grep -Eq '^mIoU +0\.00$' out.txt && grep -Eq '^aAcc +0\.00$' out.txt"

ev --list data/mix.txt --json mix.json > out.txt 2>&1
check "half-wrong labels with ignored pixels: metrics and confusion matrix as computed in numpy" \
    h json_close mix.json "$(cat expect_a.json)"
ev --list data/same.txt --confusion > out.txt 2>&1
check "--confusion: own masks as labels, 100 % on the diagonal, pred/label 1" h confusion_diag out.txt
check "--json: per_image in list order, each 100" "$PY" -c "
import json; d = json.load(open('same.json')); p = d['per_image']
assert [q['image'].split('/')[-1] for q in p] == ['a.png', 'b.png', 'c.jpg'], p
assert all(q['mIoU'] == 100 and q['aAcc'] == 100 and q['labelled'] > 0 for q in p), p"
printf 'img/a.png same/a.png\nimg/b.png shift/b.png\nimg/c.jpg same/c.png\n' > data/onebad.txt
ev --list data/onebad.txt --worst 1 --json onebad.json > out.txt 2>&1
check "--worst 1: the all-wrong image, mIoU 0" bash -c \
    "grep -A2 '^1 image of lowest mIoU' out.txt | tail -1 | grep -Eq '^ +0\.00 +0\.00  .*img/b\.png$'"
check "--worst: the per-image mIoU in the JSON agrees" "$PY" -c "
import json; p = json.load(open('onebad.json'))['per_image']
assert [q['mIoU'] for q in p] == [100, 0, 100], p"
ev --list data/same.txt --worst 0 >/dev/null 2>&1; check "--worst 0: usage error 2" test $? -eq 2

ev --images data/img --labels data/same > out.txt 2>&1
check "--images/--labels: pairs by name, mIoU 100" grep -Eq '^mIoU +100\.00$' out.txt

ev --list data/same.txt --tile 64 --overlap 0 > out.txt 2>&1
check "--tile covering the images: same result" grep -Eq '^mIoU +100\.00$' out.txt

printf 'img/a.png same/b.png\nimg/b.png same/b.png\nimg/c.jpg nolabel.png\n' > data/badpairs.txt
ev --list data/badpairs.txt > out.txt 2>err.txt
rc=$?
check "size mismatch / missing label: exit 1" test $rc -eq 1
check "size mismatch: named" grep -q 'same/b.png: label is 40x30 but its image' err.txt
check "missing label: named" grep -q 'nolabel.png' err.txt
check "the good pair still counted" grep -q '^1 image evaluated, 2 failed' out.txt

printf 'img/a.png\n' > data/oneword.txt
ev --list data/oneword.txt >/dev/null 2>&1; check "malformed list: 2" test $? -eq 2
ev --images data/img >/dev/null 2>&1; check "--images without --labels: 2" test $? -eq 2
ev --list data/same.txt --attention full > out.txt 2>&1
check "engine options: --attention full runs" bash -c "test $? -eq 0 && grep -q 'attention: full' out.txt"

ev --list data/same.txt --tta flip --json tta.json > out.txt 2>&1
check "--tta flip: runs, says so in the table and the JSON" bash -c "test $? -eq 0 && grep -q 'flip TTA' out.txt && grep -Eq '\"tta\":[[:space:]]*\"flip\"' tta.json"
check "the JSON names the model's short side" bash -c "grep -Eq '\"short_side\":[[:space:]]*\"?$("$PY" "$HELPER" json_get_cfg "$MODEL" input.short_side)\"?[,}[:space:]]' tta.json"
ev --list data/same.txt --short-side 24 --json ss.json > out.txt 2>&1
check "--short-side 24: runs, says so in the table and the JSON" bash -c "test $? -eq 0 && grep -q 'short side 24' out.txt && grep -Eq '\"short_side\":[[:space:]]*24[,}[:space:]]' ss.json"
ev --list data/same.txt --short-side native --json ssn.json > out.txt 2>&1
check "--short-side native: says so" bash -c "test $? -eq 0 && grep -q 'short side native' out.txt && grep -Eq '\"short_side\":[[:space:]]*\"native\"' ssn.json"
"$BIN" segment --threads 1 -q --tta flip data/img/a.png -o tta_pred >/dev/null 2>&1
check "segment --tta flip writes a mask" test -s tta_pred/a.png
"$BIN" render --tta flip data/img/a.png -o tta_render.png >/dev/null 2>tta_render.err
if grep -Eq "has no viewer|not available in this build" tta_render.err; then
    echo "note: no renderer in this build (-DMS_VIEWER=OFF); render --tta flip not exercised"
else
    check "render --tta flip writes a picture" test -s tta_render.png
fi
ev --list data/same.txt --tta mirror > out.txt 2>&1
rc=$?
check "--tta mirror: refused with one line naming it" bash -c "test $rc -ne 0 && grep -q \"tta: expected flip or none, got 'mirror'\" out.txt"

echo "$pass passed, $fails failed"
[ $fails -eq 0 ]
