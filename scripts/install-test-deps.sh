#!/usr/bin/env bash
# Installs what the tests need on this machine and is missing (scripts/test.sh and .ci/run
# call it; it does nothing on a machine that has everything):
# - Debian's chromium and chromium-driver: the dashboard's browser tests drive them;
# - Go (Debian's golang-go when no `go` is on PATH nor in /usr/local/go/bin; GOTOOLCHAIN then
#   fetches the Go the wrapper modules ask for): the local plane's binaries and a real node's
#   kubelet, containerd and runc are built from Go modules on first use;
# - gcc, libc6-dev and libseccomp-dev: runc is built with cgo and seccomp (containerd gives
#   every unprivileged pod's sandbox the runtime's default seccomp profile).
# The control plane and the real nodes are built and started by the tests themselves.
set -euo pipefail

have_go() { command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; }

missing=()
{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || missing+=(chromium chromium-driver)
have_go || missing+=(golang-go)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
[ -e /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
command -v ldd >/dev/null 2>&1 || missing+=(libc-bin)

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "install-test-deps: installing Debian packages the tests need: ${missing[*]}" >&2
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
if ! { "${sudo[@]}" apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"; }; then
  echo "install-test-deps: installing ${missing[*]} FAILED; the tests that need them will fail" >&2
  exit 1
fi
