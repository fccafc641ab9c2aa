#!/usr/bin/env bash
# Continues a resumable training run on a machine with an NVIDIA GPU for a bounded time, from a
# binary built on a machine without one, and brings its whole state back to resume here (or on
# the next GPU). GPU time comes in short calls and a JEM iteration is far cheaper there
# (docs/gpu.md), so a long run is carried there and back.
#
#   scripts/gpu-train.sh build              # here: --features cuda, stripped and xz'd into
#                                           # .gpu-train/jem-bench.xz (git-ignored)
#   scripts/gpu-train.sh pack RUN           # here: the latest generation of run folder RUN
#                                           # (e.g. runs/jem-aq) copied to .gpu-train/run, and
#                                           # every large tracked folder set aside but the files
#                                           # named in $GPU_TRAIN_KEEP (what --init-from reads),
#                                           # so that binary, run and tree fit the 64 MiB a call
#                                           # carries
#   scripts/gpu-train.sh run SECONDS OUT -- TRAIN-ARGS...
#                                           # there, from the repository root, carrying
#                                           # .gpu-train: `jem-bench --device cuda train
#                                           # TRAIN-ARGS` on the carried run (its --out) for at
#                                           # most SECONDS, then the run's latest generation
#                                           # tarred in 15 MiB parts into OUT with train.log
#   scripts/gpu-train.sh unpack FILES RUN   # here: the run from the returned parts replaces RUN
#                                           # (kept as RUN.before-gpu) if it went further; then
#                                           # the tracked folders are put back (`unstash` alone
#                                           # puts them back after a call that returned nothing)
#
# GPU_TRAIN_DEVICE (default cuda) is the device `run` trains on: `cpu` rehearses the round trip
# on any machine with a CPU build packed instead.
#
# TRAIN-ARGS must be the run's own command (the same settings, `--out` naming RUN): the run
# resumes where it stands, and any interruption leaves a complete generation (the state is
# crash-consistent), so the time limit costs at most the iterations since the last checkpoint.
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.gpu-train

# The latest generation's files of a run folder's state (progress.json names it).
latest_generation() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generation"])' "$1/state/progress.json"
}

# Deletes every state file of RUN but the latest generation's, so that it travels at its size.
keep_latest() {
    local run=$1 g f
    g=$(latest_generation "$run") || return 1
    for f in "$run"/state/*-*; do
        case "$(basename "$f")" in
        *-"$g".* | *-"$g") ;;
        *) rm -f "$f" ;;
        esac
    done
    rm -f "$run/jem-bench.lock"
}

build() {
    set -e
    cargo build --release --features cuda
    mkdir -p "$dir"
    cp target/release/jem-bench "$dir/jem-bench"
    strip "$dir/jem-bench"
    rm -f "$dir/jem-bench.xz"
    xz -T2 -9 "$dir/jem-bench"
    {
        echo "built from: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!results' || echo ' with uncommitted changes')"
        echo "built on: $(date -u +%FT%TZ)"
    } >"$dir/built-from.txt"
    ls -l "$dir"
}

pack() {
    local run=$1
    [ -f "$run/state/progress.json" ] || { echo "$run: no resumable state (state/progress.json)" >&2; return 1; }
    rm -rf "$dir/run" && mkdir -p "$dir" && cp -r "$run" "$dir/run" && keep_latest "$dir/run" || return 1
    echo "$run" >"$dir/run-path"
    # The binary embeds the data sets and the embedded models: no folder of results/ is read.
    bash scripts/gpu-pack.sh stash results/models results/sweeps/linf results/perf results/gpu || return 1
    # What --init-from reads goes back into place (copies, removed again by unpack).
    local keep
    : >"$dir/kept"
    for keep in ${GPU_TRAIN_KEEP:-}; do
        mkdir -p "$(dirname "$keep")" && cp ".gpu-check/stash/$keep" "$keep" && echo "$keep" >>"$dir/kept"
    done
    local bytes
    bytes=$(du -sb "$dir" | cut -f1)
    echo "pack: $run at generation $(latest_generation "$dir/run"), $((bytes / 1048576)) MiB; carry [\"$dir\"]"
    # A call carries 64 MiB with the tracked tree (about 4.5 MB once stashed). A larger run (a
    # wider network's weights and Adam moments beside the 31 MB replay buffer) goes in two calls
    # back to back on the same warm machine, which keeps ignored paths between calls: first
    # carry the binary alone, then the run (docs/gpu.md).
    if [ "$bytes" -gt $((59 * 1024 * 1024)) ]; then
        echo "pack: $dir is $((bytes / 1048576)) MiB, too much for one call with the tree: carry" \
            "[\"$dir/jem-bench.xz\", \"$dir/built-from.txt\"] in a first call (command: true)," \
            "then [\"$dir/run\", \"$dir/run-path\"] in the training call" >&2
    fi
}

run() {
    local seconds=$1 out=$2
    shift 2
    [ "${1:-}" = "--" ] && shift
    local run_path
    run_path=$(cat "$dir/run-path")
    mkdir -p "$out" "$(dirname "$run_path")"
    # cubecl caches compiled kernels under target/ by kernel id, not by source: binaries built
    # from other source (a new build) must not reuse what an earlier one compiled there.
    if ! cmp -s "$dir/built-from.txt" target/built-from.txt; then
        rm -rf target && mkdir -p target && cp "$dir/built-from.txt" target/built-from.txt
    fi
    rm -rf "$run_path" && cp -r "$dir/run" "$run_path"
    xz -dc "$dir/jem-bench.xz" >/tmp/jem-bench && chmod +x /tmp/jem-bench
    {
        echo "date: $(date -u +%FT%TZ)"
        cat "$dir/built-from.txt"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    } >"$out/machine.txt" 2>&1
    timeout --kill-after=10 "$seconds" /tmp/jem-bench --device "${GPU_TRAIN_DEVICE:-cuda}" train "$@" >"$out/train.log" 2>&1
    echo "train: exit $? after its limit of $seconds s at most" >>"$out/train.log"
    tail -n 5 "$out/train.log"
    keep_latest "$run_path"
    tar -C "$(dirname "$run_path")" -cf - "$(basename "$run_path")" | split -b 15M - "$out/run.tar.part-"
    ls -l "$out"
}

unpack() {
    local files=$1 run=$2 new
    new=$(mktemp -d)
    cat "$files"/run.tar.part-* | tar -C "$new" -xf - || return 1
    new="$new/$(basename "$run")"
    local before after
    before=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_iter"])' "$run/state/progress.json" 2>/dev/null || echo 0)
    after=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_iter"])' "$new/state/progress.json") || return 1
    if [ "$after" -le "$before" ]; then
        echo "unpack: the GPU run stands at iteration $after, $run at $before: $run kept" >&2
    else
        rm -rf "$run.before-gpu" && mv "$run" "$run.before-gpu" && mv "$new" "$run"
        echo "unpack: $run now at iteration $after (was $before; the former folder is $run.before-gpu)"
    fi
    unstash
}

# The kept copies removed (with the folders made for them), then the tracked folders put back.
unstash() {
    local keep
    while read -r keep; do
        rm -f "$keep" && rmdir -p --ignore-fail-on-non-empty "$(dirname "$keep")"
    done <"$dir/kept"
    bash scripts/gpu-pack.sh unstash
}

case "${1:-}" in
build) build ;;
pack) pack "${2:?run folder}" ;;
run) shift && run "$@" ;;
unpack) unpack "${2:?returned files}" "${3:?run folder}" ;;
unstash) unstash ;;
*)
    echo "usage: scripts/gpu-train.sh build | pack RUN | run SECONDS OUT -- TRAIN-ARGS... | unpack FILES RUN | unstash" >&2
    exit 2
    ;;
esac
