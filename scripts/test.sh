#!/usr/bin/env bash
# The project's test command (README, "Two commands"; .ci/run calls it too): installs what the
# tests need and is missing (scripts/install-test-deps.sh: Chromium, Go, gcc, libseccomp's
# headers), then runs `cargo test` with any arguments given, against the local control plane
# with simulated and real nodes (started by the tests when none runs, reused otherwise).
# Real nodes run a kubelet and containerd each: run it as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
exec cargo test "$@"
