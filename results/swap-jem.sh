#!/usr/bin/env bash
# Makes the JEM trained at the paper's 1 : 1 balance (run `aq`, docs/training-log.md) the embedded
# `results/models/jem`, and the weight-1 000 JEM embedded before it `results/models/jem-ce1000`,
# without sweeping again what does not change: every committed sweep keeps its cells of the other
# models and of the old JEM (renamed, `jem-bench merge --rename`, which checks the weights), and
# only the new JEM is swept, alone, with each part's own flags (the same as results/regenerate.sh,
# which computes the same folders from scratch).
#
#   bash results/swap-jem.sh sweep [PART...]   # the new JEM's sweeps, resumable, into runs/swap/
#   bash results/swap-jem.sh status            # which of them are merged, finished, started
#                                              # (a part-way cell: how many batches are kept)
#   bash results/swap-jem.sh save [PART...]    # them as they stand into results/train/jem-attempts/
#                                              # aq/sweeps (to commit; `sweep` continues from there)
#   bash results/swap-jem.sh install           # the new JEM's files to results/models/jem
#   bash results/swap-jem.sh merge [PART...]   # each finished part joined into its committed folder
#   bash results/swap-jem.sh rename [PART...]  # after `install`, for a part still sweeping: the
#                                              # old JEM's cells in its committed folder renamed
#                                              # (the other models kept), until `merge` joins it
#
# PART: linf l2 k-curve k10-linf k10-l2 (default: all, in that order: the most read first, then
# those that sweep the new JEM alone, so that the swap can be made before the three-model K = 10
# L2 sweep, which `merge k10-l2` joins after it as well). Every part resumes where it stopped:
# each cell keeps its finished batches and the parts of its convergence re-attacks; linf and l2 run unbatched, so
# the attack of a cell there is one batch, which a run must live through once (hours there
# on two cores for the new JEM's K = 1 cells). The folders
# that an older jem-bench made (their settings.json lacks what a
# merge checks: the reference sweep, autoattack-linf, linf-k1-full-eot4) and the tables that are
# not sweeps (nonsense, calibration, OOD, samples) are made again after `install`, by
# `bash results/regenerate.sh reference autoattack k1-eot nonsense calibration ood` with its model
# lists updated (the 1 : 1 JEM `ad` replaced by jem-ce1000; an hour or two).
#
# Two parts at once on two cores (each part has its own folder and lock): start `sweep k10-linf`
# and `sweep k10-l2` as two processes with RAYON_NUM_THREADS=1 each. Results do not depend on
# the thread count (the same examples.csv at 1 and 2 threads), and two one-thread processes get
# more done than one with both threads where batches are small: measured with `jem-bench bench
# --op pgd-step --k 5 --grad full --chains 5 --width 2`, 1.23-1.33x the work per second at the
# check's parts of 3 examples, 1.08x at attack batches of 10. But each part takes about twice as
# long on one thread (a K = 10 batch of 10 digits about 1 h 40 min), and a run stopped mid-part
# loses that part: where a run has little time left, sweep one part with both threads.
#
# On a GPU (the new JEM's K = 10 cells take days on two cores): JEM_BENCH_DEVICE=cuda with
# JEM_BENCH_BIN a `--features cuda` build sweeps there, into SWAP_WORK (default runs/swap; give
# a GPU run its own, e.g. runs/swap-gpu, carried there and back between calls). A sweep resumes
# on its own backend only, so each backend has its own committed copy (`save` with the same
# variables): train/jem-attempts/aq/sweeps/ the CPU's, sweeps-cuda/ the GPU's. `merge PART`
# takes each cell from the first folder that holds it finished: the committed table (the other
# models), this backend's sweep, the other backends' committed sweeps (merge keeps each row's
# backend: docs/scaling.md), and stops before writing anything where a cell is in none.
set -euo pipefail
cd "$(dirname "$0")/.."

new=results/train/jem-attempts/aq/model # the new JEM, swept under this path until merged
old=results/models/jem                  # the path it takes, and the old JEM's until then
kept=results/models/jem-ce1000          # the old JEM's path after the swap
wrn101=results/train/jem-attempts/ad/model # the 1 : 1 JEM on WRN-10-1, in some committed folders
bin=${JEM_BENCH_BIN:-target/release/jem-bench} # another build while this one is rebuilt
device=${JEM_BENCH_DEVICE:-cpu}
work=${SWAP_WORK:-runs/swap}
all=(linf l2 k-curve k10-linf k10-l2)

# Each part: the committed folder, the models it keeps in order (after the swap), the cells of
# its sweep of the new JEM in the plan's order (as patterns of their file names in cells/;
# none: not counted, swept whole), and the flags of its sweep in results/regenerate.sh but
# --models and --out.
part() {
    case "$1" in
    linf | l2) dest=results/sweeps/$1 models=default cells=() flags=(--norm "$1") ;;
    k-curve) dest=results/sweeps/k-curve-linf models=jem,jem-ce1000,baseline
        cells=("*.k2.full" "*.k5.full" "*.k10.full")
        flags=(--norm linf --steps 2,5,10 --eps 0,0.2 --n-examples 100 --batch-size 10 --jobs 2) ;;
    k10-linf) dest=results/sweeps/k10-linf models=jem,jem-ce1000,baseline cells=("*")
        flags=(--norm linf --steps 10 --eps 0,0.1,0.3 --n-examples 100 --batch-size 10 --jobs 2) ;;
    k10-l2) dest=results/sweeps/k10-l2 models=jem,jem-ce1000,baseline
        cells=("${new//\//_}.*" "${kept//\//_}.*" results_models_baseline.*)
        flags=(--norm l2 --steps 10 --eps 0,1,2,3 --n-examples 100 --batch-size 10 --jobs 2) ;;
    *) echo "unknown part '$1': expected one of ${all[*]}" >&2; exit 2 ;;
    esac
    [ "$models" = default ] && models=baseline,jem,adv
    models=$(echo "$models" | sed 's#\([^,]*\)#results/models/\1#g')
}

# Where the new JEM's sweeps are committed, finished or not, for a later sweep to continue: one
# folder per backend (the CPU's without a suffix).
sweeps=results/train/jem-attempts/aq/sweeps
committed=$sweeps
[ "$device" = cpu ] || committed=$sweeps-$device

# `cell_finished DIR PATTERN`: sweep folder DIR holds a finished cell named like PATTERN.
cell_finished() { compgen -G "$1/cells/$2.json" >/dev/null; }

# `finished_elsewhere PART PATTERN`: another backend's committed sweep of PART finished it.
finished_elsewhere() {
    local d
    for d in "$sweeps"-*/"$1"; do
        [ "$d" != "$committed/$1" ] && cell_finished "$d" "$2" && return 0
    done
    return 1
}

# The sweep of the new JEM for a part (k10-l2 has no committed folder: the old JEM and the
# baseline are swept there too, under the paths they keep), continued from its committed copy.
sweep() {
    part "$1"
    # A merged part's cells are in its committed folder, and its sweep copy is in the history
    # only: sweeping it again would start from scratch.
    if merged "$1"; then echo "$1: merged into $dest already; nothing to sweep" >&2; return 0; fi
    local sweep_models=$new
    [ "$1" = k10-l2 ] && sweep_models=$new,$kept,results/models/baseline
    resume "$1"
    local run=("$bin" --device "$device" robust "${flags[@]}" --models "$sweep_models" --out "$work/$1")
    # On the CPU one cell at a time, in the plan's order (K = 2 before 5 before 10), each with
    # every core on its batches: a whole sweep runs its longest cells first, side by side, so a
    # sweep stopped midway would leave every cell half done rather than the short ones
    # finished. Cells a GPU finished are left to `merge`; where there are none, the last,
    # whole run finds every cell done and writes the sweep's tables. (A GPU sweeps whole: its cells
    # side by side keep it busier, and the CPU's cells cost it little.)
    if [ "$device" = cpu ] && [ ${#cells[@]} -gt 1 ]; then
        local i elsewhere=()
        for i in "${!cells[@]}"; do
            cell_finished "$work/$1" "${cells[$i]}" && continue
            if finished_elsewhere "$1" "${cells[$i]}"; then elsewhere+=("${cells[$i]}") && continue; fi
            "${run[@]}" --shard "$i/${#cells[@]}"
        done
        if [ ${#elsewhere[@]} -gt 0 ]; then
            echo "$1: the cells ${elsewhere[*]} were finished on another backend; merge $1 joins them" >&2
            return 0
        fi
    fi
    "${run[@]}"
}

# The part's committed copy (this backend's) into the work folder, where none is there yet.
resume() {
    mkdir -p "$work"
    [ -e "$work/$1" ] || [ ! -e "$committed/$1" ] || cp -r "$committed/$1" "$work/$1"
}

# `save PART`: the part's sweep as it stands, copied to the committed folder (to commit).
save() {
    [ -e "$work/$1" ] || return 0
    rm -rf "$committed/$1" && mkdir -p "$committed" && cp -r "$work/$1" "$committed/$1"
    rm -f "$committed/$1/sweep.lock"
}

# A part is finished here when its summary is written, no cell is part-way and every counted
# cell is there (a shard's run writes a summary once its own cells are done, others' may not be).
finished() {
    [ -e "$work/$1/summary.json" ] && ! compgen -G "$work/$1/cells/*.batches" >/dev/null || return 1
    local c
    for c in "${cells[@]}"; do cell_finished "$work/$1" "$c" || return 1; done
}

# `install_folder MADE DEST`: the folder a merge made replaces DEST (without the sweep's lock).
install_folder() {
    rm -rf "$2.old" && { [ ! -e "$2" ] || mv "$2" "$2.old"; }
    cp -r "$1" "$2" && rm -rf "$2.old" "$2/sweep.lock"
}

merge() {
    part "$1"
    resume "$1"
    # Each cell from the first of these folders that holds it finished (jem-bench merge checks
    # that every cell is somewhere before it writes): the committed folder, with the old JEM's
    # cells renamed; this backend's sweep; the other backends' committed sweeps.
    local from=() renames=(--rename "$new=$old") d
    [ -e "$dest/settings.json" ] && from+=("$dest")
    [ -e "$work/$1/settings.json" ] && from+=("$work/$1")
    for d in "$sweeps"*/"$1"; do
        [ "$d" != "$committed/$1" ] && [ -e "$d/settings.json" ] && from+=("$d")
    done
    holds_old "$dest" && renames+=(--rename "$old=$kept")
    if [ "$1" = linf ] && [ ! -e results/sweeps/jem-ce1000-linf ]; then
        # The old JEM's default L∞ sweep keeps a folder of its own, beside the 1 : 1 one's.
        "$bin" merge "$dest" --rename "$old=$kept" --models "$kept" --out "$work/jem-ce1000-linf"
        install_folder "$work/jem-ce1000-linf" results/sweeps/jem-ce1000-linf
    fi
    # The 1 : 1 WRN-10-1 JEM, swept beside the old JEM in the K > 1 L∞ folders, leaves them
    # too and keeps its cells in a folder of its own (as results/regenerate.sh's jem-1to1 part
    # makes it), which `report` joins into the curve against K.
    local side=results/sweeps/jem-1to1-${dest##*/}
    if grep -q "\"$wrn101\"" "$dest/settings.json" 2>/dev/null && [ ! -e "$side" ]; then
        "$bin" merge "$dest" --models "$wrn101" --out "$work/${side##*/}"
        install_folder "$work/${side##*/}" "$side"
    fi
    rm -rf "$work/$1-merged"
    "$bin" merge "${from[@]}" "${renames[@]}" --models "$models" --out "$work/$1-merged"
    install_folder "$work/$1-merged" "$dest"
}

# Whether `merge PART` has joined the new JEM's cells into the committed folder: the new JEM
# is installed and the folder has cells under its path (before the merge, `rename` has moved the
# old JEM's away).
merged() {
    cmp -s results/models/jem.safetensors "$new.safetensors" \
        && compgen -G "$dest/cells/${old//\//_}.*" >/dev/null
}

# Whether a committed folder still holds the old JEM under its former path.
holds_old() { [ -e "$1/settings.json" ] && grep -q "\"$old\"" "$1/settings.json"; }

# `rename PART`: the committed folder with the old JEM renamed, every other model kept, for a
# part whose new-JEM sweep is not finished (merge joins it later and drops the other models).
rename() {
    part "$1"
    holds_old "$dest" || { echo "$1: $dest holds no $old to rename" >&2; return 0; }
    rm -rf "$work/$1-renamed"
    # Without --models, merge keeps every model in the folder's order.
    "$bin" merge "$dest" --rename "$old=$kept" --out "$work/$1-renamed"
    install_folder "$work/$1-renamed" "$dest"
}

cmd=${1:-}
shift || true
parts=("${@:-${all[@]}}")
case "$cmd" in
sweep) [ -n "${JEM_BENCH_BIN:-}" ] || cargo build --release; for p in "${parts[@]}"; do sweep "$p"; done ;;
status) for p in "${parts[@]}"; do
        part "$p" && resume "$p"
        if merged "$p"; then echo "$p: merged into $dest"
        elif finished "$p"; then echo "$p: finished"; elif [ -e "$work/$p" ]; then echo "$p: started";
        else echo "$p: not started"; fi
        for c in "${cells[@]}"; do
            cell_finished "$work/$p" "$c" && echo "  $c: finished here"
            finished_elsewhere "$p" "$c" && echo "  $c: finished on another backend"
            true
        done
        # A part-way cell is a folder of the batches (and convergence-check parts) kept so far.
        for b in "$work/$p"/cells/*.batches; do
            [ -d "$b" ] || continue
            n=$( { compgen -G "$b/[0-9]*.json" || true; } | wc -l)
            m=$( { compgen -G "$b/convergence/[0-9]*.json" || true; } | wc -l)
            echo "  $(basename "$b" .batches): part-way, $n attack batches and $m convergence-check parts kept"
        done
    done ;;
install)
    cmp -s results/models/jem.safetensors "$kept.safetensors" \
        || { echo "results/models/jem is not the old JEM any more: nothing to install" >&2; exit 1; }
    cp "$new.json" results/models/jem.json && cp "$new.safetensors" results/models/jem.safetensors ;;
merge) cargo build --release; for p in "${parts[@]}"; do merge "$p"; done ;;
rename) for p in "${parts[@]}"; do rename "$p"; done ;;
save) for p in "${parts[@]}"; do part "$p" && save "$p"; done ;;
*) echo "usage: swap-jem.sh sweep|status|save|install|merge|rename [PART...]" >&2; exit 2 ;;
esac
