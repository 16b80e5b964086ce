#!/usr/bin/env bash
# Renders every workflow envbridge can read, with `-o tasks` and `-o yaml`, into OUTDIR: the
# project's own (manifests/), the anchor's corpus, and the corpus under each conformance case's
# configuration store. Two snapshots from two binaries compare with `diff -r` (byte for byte,
# errors and exit codes included). Usage: scripts/render-snapshot.sh BIN OUTDIR
set -u
BIN=$1
OUT=$2
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
SHARED=${SHARED:-../shared}
CW=$SHARED/corpus/aliecs/controlworkflows
HOSTS='["flp001","flp002","flp003"]'
one() { # NAME FORMAT ARGS...
  local name=$1 fmt=$2
  shift 2
  "$BIN" render -o "$fmt" "$@" > "$OUT/$name.$fmt" 2>&1
  echo "rc=$?" >> "$OUT/$name.$fmt"
}
for wf in manifests/control-workflows/workflows/*.yaml; do
  for fmt in tasks yaml; do
    one "ship-$(basename "$wf" .yaml)" "$fmt" --tasks manifests/control-workflows/tasks \
      --defaults manifests/site/local.yaml --set hosts="$HOSTS" --env-id 2abcDEFghij -n ns1 "$wf"
  done
done
for wf in "$CW"/workflows/*.yaml; do
  for fmt in tasks yaml; do
    one "corpus-$(basename "$wf" .yaml)" "$fmt" --tasks "$CW/tasks" --set hosts="$HOSTS" \
      --env-id 2abcDEFghij "$wf"
  done
done
for case in "$SHARED"/conformance/aliecs/*/; do
  case=${case%/}
  [ -f "$case/workflow" ] || continue
  args=()
  while IFS= read -r kv; do [ -n "$kv" ] && args+=(--set "$kv"); done < "$case/vars"
  for wf in "$CW"/workflows/*.yaml; do
    for fmt in tasks yaml; do
      one "case-$(basename "$case")-$(basename "$wf" .yaml)" "$fmt" --tasks "$CW/tasks" \
        --workflows "$CW/workflows" --config "$case/config.yaml" "${args[@]}" --env-id envcheck01 "$wf"
    done
  done
done
echo "$(ls "$OUT" | wc -l) outputs in $OUT ($(grep -l '^rc=0$' "$OUT"/* | wc -l) rendered)"
