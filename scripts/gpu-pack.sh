#!/usr/bin/env bash
# Packing the GPU check for a GPU machine without a Rust toolchain (optional; on a machine with
# one, scripts/gpu-check.sh builds what it needs):
#
#   scripts/gpu-pack.sh build          # here: --features cuda builds, stripped and xz'd into
#                                      # .gpu-check/bin (git-ignored), about 30 MB; there,
#                                      # scripts/gpu-check.sh uses them instead of building
#   scripts/gpu-pack.sh stash [PATH…]  # here, before copying the tree there: moves the large
#                                      # tracked folders the check does not read (the binaries
#                                      # embed the data sets) into .gpu-check/stash, and PATHs too
#   scripts/gpu-pack.sh unstash        # here, after it: puts them back
#   scripts/gpu-pack.sh test-binary    # prints the path of the GPU test binary cargo built
set -uo pipefail
cd "$(dirname "$0")/.."

bin=.gpu-check/bin

test_binary() {
    # The test binary's path has a hash: ask cargo for it.
    cargo test --release --features cuda --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])'
}

build() {
    set -e
    cargo build --release --features cuda
    local test_bin
    test_bin=$(test_binary)
    rm -rf "$bin" && mkdir -p "$bin"
    cp target/release/jem-bench "$bin/jem-bench"
    cp "$test_bin" "$bin/gpu-tests"
    strip "$bin/jem-bench" "$bin/gpu-tests"
    xz -T2 -6 "$bin/jem-bench" "$bin/gpu-tests"
    # What the binaries were built from (the GPU machine's copy of the tree cannot say: its
    # large folders are stashed, and uncommitted changes travel too).
    {
        echo "built from: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!results' || echo ' with uncommitted changes')"
        echo "built on: $(date -u +%FT%TZ)"
    } >"$bin/built-from.txt"
    ls -l "$bin"
}

# Tracked folders the GPU machine does not read (the binaries embed the data sets): every
# committed sweep but results/sweeps/linf (what the K = 0 and 1 cells are compared with) and the
# large folders below, so that the tree and the two binaries fit what a device call carries.
big=(results/train datasets/data results/samples results/reference results/ood)

# `stash [PATH...]`: the PATHs go aside too (results/sweeps/linf among them, if named).
stash() {
    mkdir -p .gpu-check/stash
    local d
    for d in "${big[@]}" results/sweeps/* "$@"; do
        [ "$d" = results/sweeps/linf ] && [[ " $* " != *" results/sweeps/linf "* ]] && continue
        [ -e "$d" ] || continue
        mkdir -p ".gpu-check/stash/$(dirname "$d")"
        mv "$d" ".gpu-check/stash/$d" && echo "$d" >>.gpu-check/stash/moved
    done
}

unstash() {
    local d
    while read -r d; do
        mv ".gpu-check/stash/$d" "$d"
    done <.gpu-check/stash/moved
    rm .gpu-check/stash/moved
}

case "${1:-}" in
build) build ;;
stash) shift && stash "$@" ;;
unstash) unstash ;;
test-binary) test_binary ;;
*)
    echo "usage: scripts/gpu-pack.sh build | stash [PATH...] | unstash | test-binary" >&2
    exit 2
    ;;
esac
