#!/usr/bin/env bash
# Runs every case of ../shared/conformance/aliecs (or the folders given) through
# `envbridge render -o tasks` and the anchor's checker, `compare.py --full`.
# usage: scripts/conformance.sh [ENVBRIDGE] [CASE_DIR]...
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/debug/envbridge}
shift || true
if [ ! -x "$BIN" ]; then
  echo "conformance: no envbridge binary at $BIN (run cargo build, or pass the binary's path)" >&2
  exit 2
fi
SHARED=${ENVBRIDGE_SHARED:-../shared}
CW=$SHARED/corpus/aliecs/controlworkflows
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=("$SHARED"/conformance/aliecs/*/)
fail=0
pass=0
for C in "${CASES[@]}"; do
  C=${C%/}
  [ -f "$C/workflow" ] || continue
  args=()
  while IFS= read -r kv; do [ -n "$kv" ] && args+=(--set "$kv"); done < "$C/vars"
  out=$(mktemp)
  if "$BIN" render "$CW/workflows/$(cat "$C/workflow").yaml" --tasks "$CW/tasks" --workflows "$CW/workflows" \
      --config "$C/config.yaml" "${args[@]}" --env-id envcheck01 -o tasks > "$out" &&
     python3 "$SHARED/conformance/aliecs/compare.py" "$out" "$C/expected.json" --full; then
    echo "conformance $(basename "$C"): same"
    pass=$((pass + 1))
  else
    echo "conformance $(basename "$C"): DIFFERENT"
    fail=$((fail + 1))
  fi
  rm -f "$out"
done
echo "conformance: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
