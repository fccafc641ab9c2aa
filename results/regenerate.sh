#!/usr/bin/env bash
# Regenerates the committed results that depend on the models under results/models/ (what each
# folder is: results/README.md). Run it from the repository root after a model changes
# (`regress` refuses a reference swept with other weights). Days on two cores in all; every
# sweep resumes where it stopped, the batched ones batch by batch.
#
#   bash results/regenerate.sh            # everything
#   bash results/regenerate.sh reference  # one part: reference | sweeps (or linf | l2) | jem-ce1000 | jem-1to1 | control | k1-eot | k-curve | k10 | nonsense | calibration | ood | samples
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release
bin=target/release/jem-bench
parts=("${@:-reference sweeps jem-ce1000 jem-1to1 control k1-eot k-curve k10 nonsense calibration ood samples}")

# Each part writes to a fresh folder under runs/regenerate/ and replaces the committed folder
# only when it finished, so an interrupted regeneration leaves the old results whole (and
# rerunning the same part resumes the sweep where it stopped).
work=runs/regenerate
mkdir -p "$work"

replace() { # replace SRC DEST
    rm -rf "$2.old" && { [ ! -e "$2" ] || mv "$2" "$2.old"; } && cp -r "$1" "$2" && rm -rf "$2.old" "$2.partial"
}

# A sweep stopped before it finished is committed beside its destination as DEST.partial
# (the finished cells and the settings); the part that makes DEST continues from it on a fresh
# clone, and replace removes it once DEST is whole.
continue_from() { # continue_from DEST WORK
    if [ ! -e "$2" ] && [ -e "$1.partial" ]; then
        cp -r "$1.partial" "$2"
    fi
}

# A batched sweep's committed folder, finished or not, is where its part continues on a fresh
# clone (each finished batch is kept).
resume_committed() { # resume_committed DEST WORK
    if [ ! -e "$2" ] && [ -e "$1" ]; then cp -r "$1" "$2"; fi
}

# The batched sweeps: 100 digits in batches of 10, two cells at a time.
batched=(--n-examples 100 --batch-size 10 --jobs 2)

for part in ${parts[*]}; do
    case "$part" in
    reference)
        # Cheap on purpose, since CI reruns it (`regress`): BPDA, one draw and no convergence
        # check at K = 1; it guards against changes in what the harness computes, the sweeps
        # below measure robustness.
        "$bin" robust --norm linf --models results/models/baseline,results/models/jem,results/models/adv \
            --attacks pgd,fgsm --steps 0,1 --eps 0,0.1,0.2,0.3 --n-examples 50 --pgd-steps 10 \
            --chains 2 --recheck-chains 4 --grad bpda --eot 1 --convergence-sample 0 \
            --out "$work/reference-linf-small"
        replace "$work/reference-linf-small" results/reference/linf-small
        ;;
    sweeps | linf | l2)
        # The default sweeps (`sweeps` both norms, or one), and both norms' curves in one figure.
        norms=(linf l2)
        [ "$part" = sweeps ] || norms=("$part")
        for norm in "${norms[@]}"; do
            continue_from "results/sweeps/$norm" "$work/sweep-$norm"
            "$bin" robust --norm "$norm" --out "$work/sweep-$norm"
            replace "$work/sweep-$norm" "results/sweeps/$norm"
        done
        "$bin" report results/sweeps/linf results/sweeps/l2 --out results/sweeps
        ;;
    jem-ce1000)
        # The JEM embedded before the 1 : 1 one, log p(y|x) weighted 1 000 : 1 against log p(x)
        # (99.00 % test), swept as the default L∞ sweep sweeps the embedded models: what that
        # weight costs in robustness (docs/training-log.md).
        "$bin" robust --norm linf --models results/models/jem-ce1000 --out "$work/jem-ce1000-linf"
        replace "$work/jem-ce1000-linf" results/sweeps/jem-ce1000-linf
        ;;
    jem-1to1)
        # The JEM at the paper's 1 : 1 balance on the narrower WRN-10-1 that the embedded JEM was
        # widened from (96.69 % test accuracy), swept the same way: the same objective on a
        # quarter of the network (docs/training-log.md).
        "$bin" robust --norm linf --models results/models/jem-1to1 --out "$work/jem-1to1-linf"
        replace "$work/jem-1to1-linf" results/sweeps/jem-1to1-linf
        # And its K > 1 cells, swept as the k-curve and k10 parts sweep the embedded models
        # (hours of cell time each; batches of 10 resume); `report` joins the first into one
        # curve with the embedded models'.
        for sweep in "k-curve-linf 2,5,10 0,0.2" "k10-linf 10 0,0.1,0.3"; do
            read -r name steps eps <<<"$sweep"
            resume_committed "results/sweeps/jem-1to1-$name" "$work/jem-1to1-$name"
            "$bin" robust --norm linf --models results/models/jem-1to1 --steps "$steps" \
                --eps "$eps" "${batched[@]}" --out "$work/jem-1to1-$name"
            replace "$work/jem-1to1-$name" "results/sweeps/jem-1to1-$name"
        done
        ;;
    control)
        # The control for the JEMs: the embedded baseline's recipe trained with the JEMs' data
        # noise σ = 0.1 (results/models/baseline-sigma01, docs/training-log.md), swept as the
        # default sweeps the embedded models, so that JEM against control isolates the p(x) term.
        "$bin" robust --norm linf --models results/models/baseline-sigma01 --out "$work/baseline-sigma01-linf"
        replace "$work/baseline-sigma01-linf" results/sweeps/baseline-sigma01-linf
        ;;
    k1-eot)
        # The K = 1 rows under APGD-CE alone with the gradient through the SGLD step (not BPDA)
        # and 4 EOT draws per step: what APGD-DLR adds in the default, and the middle row between
        # BPDA and the default; the two JEMs and the baseline (the adversarially trained model
        # is left out: its K = 1 rows equal its K = 0 rows). Batches of 10 resume.
        continue_from results/sweeps/linf-k1-full-eot4 "$work/linf-k1-full-eot4"
        "$bin" robust --norm linf --models results/models/jem,results/models/jem-ce1000,results/models/baseline \
            --attacks apgd-ce --steps 1 --grad full --eot 4 --eps 0,0.1,0.2,0.3 "${batched[@]}" \
            --out "$work/linf-k1-full-eot4"
        replace "$work/linf-k1-full-eot4" results/sweeps/linf-k1-full-eot4
        ;;
    k-curve)
        # Robust accuracy against the number of SGLD steps K (the paper's key figure) under the
        # adaptive default (full gradients through every step, EOT, convergence checks): K = 2,
        # 5, 10 at ε = 0.2 for the two JEMs and the baseline, beside the default sweeps' K = 0
        # and 1 (`report` joins them into k-curve.csv / .svg / .png). Days on two cores (a K = 10
        # gradient costs about 7 of K = 1); it resumes cell by cell, and the committed folder
        # may hold only the cells finished so far.
        # Batches of 10 keep each finished batch, so a run stopped mid-cell loses little;
        # a partial folder committed under results/ is picked up and continued here.
        resume_committed results/sweeps/k-curve-linf "$work/k-curve-linf"
        "$bin" robust --norm linf --models results/models/jem,results/models/jem-ce1000,results/models/baseline \
            --steps 2,5,10 --eps 0,0.2 "${batched[@]}" --out "$work/k-curve-linf"
        replace "$work/k-curve-linf" results/sweeps/k-curve-linf
        "$bin" report results/sweeps/linf results/sweeps/jem-ce1000-linf results/sweeps/jem-1to1-linf \
            results/sweeps/jem-1to1-k-curve-linf results/sweeps/k-curve-linf --out results/sweeps/k-curve
        ;;
    k10)
        # K = 10, the paper's setting, at the other two L∞ radii (ε = 0.2 is the k-curve's), then
        # at the default L2 radii, under the same adaptive default, for the same three models.
        # Days on two cores; each sweep resumes batch by batch like k-curve, from a partial
        # folder committed under results/.
        for sweep in "linf 0,0.1,0.3" "l2 0,1,2,3"; do
            read -r norm eps <<<"$sweep"
            resume_committed "results/sweeps/k10-$norm" "$work/k10-$norm"
            "$bin" robust --norm "$norm" --models results/models/jem,results/models/jem-ce1000,results/models/baseline \
                --steps 10 --eps "$eps" "${batched[@]}" --out "$work/k10-$norm"
            replace "$work/k10-$norm" "results/sweeps/k10-$norm"
        done
        # The baseline's K = 10 L2 cell again under two other attacks, compared digit by digit
        # with its full-gradient cell above (the examples.csv files) as checks for masked
        # gradients: BPDA, the classifier's own gradient at the sampled point (about 30 min on
        # two cores), and Square, the score-based black box, at ε = 2 (1 000 queries; about two
        # hours). No convergence check: they test the attack above, not the model.
        for check in "bpda --attacks autoattack-rand --grad bpda --eps 0,2,3" \
            "square --attacks square --square-queries 1000 --eps 0,2"; do
            read -r name flags <<<"$check"
            resume_committed "results/sweeps/k10-l2-$name-baseline" "$work/k10-l2-$name-baseline"
            # shellcheck disable=SC2086 # $flags is a list of words
            "$bin" robust --norm l2 --models results/models/baseline $flags --steps 10 --n-examples 100 \
                --batch-size 10 --convergence-sample 0 --out "$work/k10-l2-$name-baseline"
            replace "$work/k10-l2-$name-baseline" "results/sweeps/k10-l2-$name-baseline"
        done
        ;;
    nonsense)
        rm -rf "$work/nonsense" # nonsense searches do not resume
        "$bin" nonsense --steps 0,1,10 --out "$work/nonsense"
        replace "$work/nonsense" results/nonsense
        ;;
    calibration)
        "$bin" calibrate --steps 0,1,10 --out "$work/calibration"
        replace "$work/calibration" results/calibration
        ;;
    ood)
        rm -rf "$work/ood"
        "$bin" ood --steps 0 --out "$work/ood"
        # K = 1 differentiates through the SGLD step (slow): 200 images, with K = 0 on the same
        # 200 to compare against.
        "$bin" ood --steps 1 --n 200 --out "$work/ood/k1-n200"
        "$bin" ood --steps 0 --n 200 --out "$work/ood/k0-n200"
        replace "$work/ood" results/ood
        ;;
    samples)
        # SGLD samples of the embedded JEM from uniform noise (200 and 1 000 steps; 1 000
        # samples for the quality numbers), and the class-Gaussian chain starts on the baseline.
        rm -rf "$work/samples" && mkdir -p "$work/samples/quality" "$work/samples/chain-starts"
        jem=(--model results/models/jem --seed 1)
        "$bin" sample "${jem[@]}" --per-class 10 --steps 200 --out "$work/samples/jem.png"
        "$bin" sample "${jem[@]}" --per-class 10 --steps 1000 \
            --out "$work/samples/jem-from-noise-1000-steps.png"
        "$bin" sample "${jem[@]}" --per-class 100 --steps 200 \
            --out "$work/samples/quality/jem-uniform-200.png"
        starts=(--model results/models/baseline --from-class-gaussian --per-class 10 --seed 1)
        "$bin" sample "${starts[@]}" --steps 0 --out "$work/samples/chain-starts/starts.png"
        "$bin" sample "${starts[@]}" --steps 100 \
            --out "$work/samples/chain-starts/baseline-100-steps.png"
        replace "$work/samples" results/samples
        ;;
    *)
        echo "unknown part '$part': expected reference, sweeps, linf, l2, jem-ce1000, jem-1to1, control, k1-eot, k-curve, k10, nonsense, calibration, ood or samples" >&2
        exit 2
        ;;
    esac
done

# The figures are committed: recompressed losslessly where optipng is installed (Debian's
# optipng: the same pixels in up to half the bytes the png crate writes), as the committed
# ones are.
if command -v optipng >/dev/null; then
    find results -name '*.png' -print0 | xargs -0 optipng -quiet -o2
fi
