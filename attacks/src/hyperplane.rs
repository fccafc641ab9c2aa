//! The exact projection FAB takes at each iteration: the smallest step, in L∞ or L2, onto a
//! hyperplane `w·δ = c` within a box `lb ≤ δ ≤ ub` (the pixel range around the current point),
//! solved on the host in f64 on the sorted breakpoints of a piecewise-linear function, so the
//! geometry does not depend on the backend.

use crate::norm::Norm;

/// The smallest step in `norm` onto the hyperplane `w·δ = c` within the box `lb ≤ δ ≤ ub`
/// ([`hyperplane_step_linf`] or [`hyperplane_step_l2`]).
pub(crate) fn hyperplane_step(norm: Norm, w: &[f32], c: f32, lb: &[f32], ub: &[f32]) -> Vec<f32> {
    match norm {
        Norm::Linf => hyperplane_step_linf(w, c, lb, ub),
        Norm::L2 => hyperplane_step_l2(w, c, lb, ub),
    }
}

/// The smallest λ ≥ 0 with Σ_d q_d·min(λ, cap_d) = c (q_d > 0, cap_d ≥ 0, c ≥ 0); ∞ when even
/// λ = ∞ falls short. The sum is continuous, piecewise linear and nondecreasing in λ, with
/// breakpoints at the caps: sorting them, the segment that reaches c is found in one pass.
fn level(mut items: Vec<(f64, f64)>, c: f64) -> f64 {
    if c <= 0.0 {
        return 0.0;
    }
    items.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    // free[k]: Σ q over the items not yet saturated when λ passes the k-th smallest cap.
    let mut free = vec![0.0f64; items.len() + 1];
    for k in (0..items.len()).rev() {
        free[k] = free[k + 1] + items[k].1;
    }
    let mut saturated = 0.0f64;
    for (k, &(cap, q)) in items.iter().enumerate() {
        // On [previous cap, cap] the sum is saturated + free[k]·λ.
        if saturated + free[k] * cap >= c {
            return (c - saturated) / free[k];
        }
        saturated += q * cap;
    }
    f64::INFINITY
}

/// Orients the problem so that the right-hand side is ≥ 0: returns the sign s (w' = s·w,
/// c' = s·c = |c|).
fn orientation(c: f32) -> f64 {
    if c < 0.0 {
        -1.0
    } else {
        1.0
    }
}

/// The step δ of least L2 norm with `w·δ = c` and `lb ≤ δ ≤ ub` (lb ≤ 0 ≤ ub, per
/// coordinate). Its optimality conditions give δ(λ) = clip(λ w, lb, ub) with λ the level at
/// which w·δ(λ) = c, found exactly on the sorted breakpoints. When the box cannot reach the
/// hyperplane, δ goes as far as the box allows toward it (the corner clip(±∞·w)); a zero
/// `w` gives δ = 0.
pub fn hyperplane_step_l2(w: &[f32], c: f32, lb: &[f32], ub: &[f32]) -> Vec<f32> {
    let s = orientation(c);
    // With w' = s·w and λ ≥ 0, coordinate d moves as clip(λ w'_d) and contributes
    // w'_d² · min(λ, cap_d), cap_d the level at which it reaches its bound.
    let items: Vec<(f64, f64)> = (0..w.len())
        .filter(|&d| w[d] != 0.0)
        .map(|d| {
            let wd = s * w[d] as f64;
            let bound = if wd > 0.0 { ub[d] } else { lb[d] } as f64;
            ((bound / wd).max(0.0), wd * wd)
        })
        .collect();
    let lambda = level(items, (s * c as f64).max(0.0));
    (0..w.len())
        .map(|d| {
            if w[d] == 0.0 {
                return 0.0;
            }
            let v = lambda * s * w[d] as f64;
            v.max(lb[d] as f64).min(ub[d] as f64) as f32
        })
        .collect()
}

/// The step δ of least L∞ norm with `w·δ = c` and `lb ≤ δ ≤ ub` (lb ≤ 0 ≤ ub, per
/// coordinate). Within |δ_d| ≤ t the box lets w·δ reach Σ_d |w_d| min(t, room_d), room_d
/// the box's room in the direction sign(w_d)·sign(c); the answer is the smallest t that
/// reaches c (exactly, on the sorted breakpoints), with δ_d = sign(w_d c) min(t, room_d).
/// When the box cannot reach the hyperplane, δ goes as far as the box allows toward it; a
/// zero `w` gives δ = 0.
pub fn hyperplane_step_linf(w: &[f32], c: f32, lb: &[f32], ub: &[f32]) -> Vec<f32> {
    let s = orientation(c);
    let room = |d: usize| -> f64 {
        if s * w[d] as f64 > 0.0 {
            (ub[d] as f64).max(0.0)
        } else {
            (-lb[d] as f64).max(0.0)
        }
    };
    let items: Vec<(f64, f64)> = (0..w.len())
        .filter(|&d| w[d] != 0.0)
        .map(|d| (room(d), (w[d] as f64).abs()))
        .collect();
    let t = level(items, (s * c as f64).max(0.0));
    (0..w.len())
        .map(|d| {
            if w[d] == 0.0 {
                return 0.0;
            }
            let direction = (s * w[d] as f64).signum();
            (direction * t.min(room(d))) as f32
        })
        .collect()
}
