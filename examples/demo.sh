#!/usr/bin/env bash
# capsan demo: run a buggy DLPack consumer natively, then under capsan.
# `make demo` builds everything first; this script only runs things.
set -uo pipefail
ulimit -c 0  # the native run aborts: no core file
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3
CAPSAN="$ROOT/build/bin/capsan"
for f in "$CAPSAN" "$ROOT/build/lib/libcapsan.so" "$ROOT/build/tests/dlproducer.so" \
         "$ROOT/build/tests/dlconsumer.so"; do
  [ -e "$f" ] || { echo "demo: $f is missing; run 'make demo' (or 'make && make fixtures')" >&2; exit 1; }
done
export PYTHONPATH="$ROOT/build/tests"
OUT="$(mktemp -d "${TMPDIR:-/tmp}/capsan-demo.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT
PROG="$ROOT/examples/double_delete.py"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. Without capsan: $PY examples/double_delete.py"
"$PY" "$PROG"
echo "(exit status $? -- glibc noticed a double free, but not where it came from)"

say "2. Under capsan: capsan run -- $PY examples/double_delete.py"
"$CAPSAN" run --log-path "$OUT/trace" -- "$PY" "$PROG"
echo "(exit status $? -- capsan reported the second delete before it ran; its free() then aborted in glibc, as without capsan, and capsan's crash report above says where)"

say "3. Under capsan with protect=1 (and report=none): the second deleter call is skipped, the program survives"
CAPSAN_OPTIONS=protect=1:report=none "$CAPSAN" run --log-path "$OUT/protected" -- "$PY" "$PROG"
status=$?
echo "(exit status $status: capsan's exitcode, 23 as in LeakSanitizer, because an error was found)"

say "4. Offline: capsan report reads the trace file that run left behind"
traces=("$OUT"/protected.[0-9]*)
"$CAPSAN" report --format text "${traces[@]}"

# the demo succeeded if capsan found the bug at the right place
json="$("$CAPSAN" report --format json "${traces[@]}")"
line=$(grep -n "dlconsumer.double_delete(capsule)" "$PROG" | cut -d: -f1)
if [ "$status" = 23 ] && grep -q '"dlpack-double-delete"' <<<"$json" \
   && grep -q "\"line\": *$line" <<<"$json"; then
  say "demo ok: dlpack-double-delete at examples/double_delete.py:$line"
  exit 0
fi
echo "demo: capsan did not report the double delete as expected" >&2
exit 1
