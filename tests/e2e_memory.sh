#!/usr/bin/env bash
# Memory promises of the commands: an image whose run would exceed the memory
# budget (--max-memory; default half of physical memory) is refused with one
# line before it is decoded (a 16000x16000 PNG of 250 KB costs the refusing
# process almost nothing), by segment, eval and render alike; what fits runs.
set -u

. "$(dirname "$0")/common_e2e.sh"

# A 16000x16000 grey PNG, streamed so neither Python nor the file is large.
"$PY" - <<'PY'
import struct, zlib
w = h = 16000
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
z = zlib.compressobj(9)
row = b'\0' * (w + 1)
idat = b''.join(z.compress(row) for _ in range(h)) + z.flush()
with open('big.png', 'wb') as f:
    f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0))
            + chunk(b'IDAT', idat) + chunk(b'IEND', b''))
PY
"$PY" "$HELPER" img small.png 64 48 1

# peak RSS (KiB) of a command, its exit status in rc.txt, stderr in err.txt
peak() {
    "$PY" -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=open("err.txt", "w"))
open("rc.txt", "w").write(str(r.returncode))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"
}

kb=$(peak "$BIN" segment --threads 1 --max-memory 1G big.png -o out)
rc=$(cat rc.txt)
check "segment: over budget refused (exit $rc)" test "$rc" -eq 1
check "segment: the message names the file, size and budget" \
    grep -q "big.png: a 16000x16000 image would need about .* over the memory budget of 1024 MiB (--max-memory)" err.txt
check "segment: refused before decoding (peak RSS $kb KiB < 200 MiB)" test "$kb" -lt 204800
check "segment: nothing written" test ! -e out/big.png

printf 'big.png small.png\n' > list.txt
"$PY" "$HELPER" img small_label.png 64 48 2 L
kb=$(peak "$BIN" eval --threads 1 -q --max-memory 1G --list list.txt)
check "eval: over budget is that image's error (exit $(cat rc.txt))" test "$(cat rc.txt)" -ne 0
check "eval: the message names the image" grep -q "big.png: a 16000x16000 image would need" err.txt
check "eval: refused before decoding (peak RSS $kb KiB)" test "$kb" -lt 204800

if "$BIN" render --help > /dev/null 2>&1; then
    kb=$(peak "$BIN" render --threads 1 --max-memory 1G big.png -o r.png)
    check "render: over budget refused (exit $(cat rc.txt))" test "$(cat rc.txt)" -eq 1
    check "render: the message names the image" grep -q "big.png: a 16000x16000 image would need" err.txt
    check "render: refused before decoding (peak RSS $kb KiB)" test "$kb" -lt 204800
fi

"$BIN" segment --threads 1 -q --max-memory 1G small.png -o out 2> err.txt
check "an image within the budget is segmented" test -s out/small.png

"$BIN" segment --threads 1 -q --max-memory 12X small.png -o out2 2> err.txt
check "bad --max-memory: usage error (exit 2)" test $? -eq 2
check "bad --max-memory: says what it expects" grep -q "max-memory: expected a size" err.txt

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
