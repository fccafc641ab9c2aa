//! A finished cell's rows (per stage and ε) and per-example records, with what every row
//! records besides its counts: settings, probe, defence, backend, software.

use super::attack::Stage;
use super::probe::Probe;
use super::work::Loaded;
use crate::harness::cells::Cell;
use crate::harness::rows::{ExampleRow, GradColumn, TidyRow};
use crate::harness::spec::SweepSpec;
use crate::model::SOFTWARE;

/// What every row of a cell records besides its counts and attack.
pub(in crate::harness) struct CellFacts {
    pub(in crate::harness) probe: Probe,
    /// The defence's settings.
    pub(in crate::harness) defence: serde_json::Value,
    /// The backend and device, as outputs name them.
    pub(in crate::harness) backend: String,
    /// The sweep's own attacks, each with whether it follows gradients (and so has EOT draws).
    pub(in crate::harness) own: Vec<(String, bool)>,
}

/// The rows (per stage and ε) and per-example records of a cell's finished `stages`; the rows'
/// counts, accuracies and intervals are left for [`robustness::with_own_rates`] to compute from
/// the examples (NaN until then).
pub(in crate::harness) fn rows_and_examples(
    spec: &SweepSpec,
    cell: &Cell,
    stages: &[Stage],
    loaded: &Loaded,
    eps_grid: &[f32],
    facts: &CellFacts,
) -> (Vec<TidyRow>, Vec<ExampleRow>) {
    let (probe, defence_settings) = (&facts.probe, &facts.defence);
    let (n, norm) = (loaded.indices.len(), spec.threat.norm);
    let grad = GradColumn::of(cell.grad);
    let row = |stage: &Stage, eps: f32| {
        let gradients = stage.name.follows_gradients(&facts.own) == Some(true);
        TidyRow {
            model: cell.model.clone(),
            attack: stage.name.clone(),
            norm,
            eps,
            k: cell.k,
            grad,
            n,
            clean_accuracy: f64::NAN,
            clean_lo: f64::NAN,
            clean_hi: f64::NAN,
            robust_accuracy: f64::NAN,
            robust_lo: f64::NAN,
            robust_hi: f64::NAN,
            eot: if gradients { spec.eot_at(cell.k) } else { 0 },
            restarts: stage
                .name
                .single()
                .map_or(spec.budgets.restarts.get(), |kind| {
                    (kind.entry().restarts)(spec)
                }),
            chains: if cell.k > 0 { spec.defence.chains } else { 0 },
            recheck_chains: if cell.k > 0 {
                spec.defence.recheck_chains
            } else {
                0
            },
            seed: spec.seed,
            attack_settings: stage.settings.to_string(),
            defence: defence_settings.to_string(),
            stochastic: probe.stochastic,
            zero_gradients: probe.zero_gradients,
            // A quick look's rows are upper bounds; BPDA rows at K > 0 are marked where the
            // rows are assembled (robustness::tidy_rows).
            upper_bound: spec.quick,
            check_sampled: None,
            check_broken_eot: None,
            check_broken_iterations: None,
            check_broken: None,
            data: loaded.spec.to_string(),
            software: SOFTWARE.into(),
            backend: facts.backend.clone(),
        }
    };
    let mut rows = Vec::new();
    let mut examples = Vec::new();
    for stage in stages {
        for (eps, outcome) in &stage.outcomes {
            let ex = &outcome.examples;
            match eps {
                Some(e) => rows.push(row(stage, *e)),
                None => rows.extend(eps_grid.iter().map(|&e| row(stage, e))),
            }
            examples.extend(ex.iter().zip(&loaded.indices).map(|(e, &i)| ExampleRow {
                model: cell.model.clone(),
                attack: stage.name.clone(),
                norm,
                eps: *eps,
                k: cell.k,
                grad,
                example: i,
                label: loaded.data.labels[i],
                clean_correct: e.clean_correct,
                adversarial: e.adversarial,
                l0: e.l0,
                l2: e.l2,
                linf: e.linf,
                gradient_evals: e.gradient_evals,
                forward_evals: e.forward_evals,
            }));
        }
    }
    (rows, examples)
}
