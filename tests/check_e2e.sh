# Sourced by the shell tests (not matched by their glob): the pass/fail
# counters and check NAME CMD... (CMD must succeed).
fails=0
pass=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fails=$((fails + 1)); echo "FAIL $*"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
