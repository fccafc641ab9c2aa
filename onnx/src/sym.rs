//! Load-time integers that may involve the batch size: `k` or `k·N`.
//!
//! Only the batch dimension of the input is dynamic, so every shape value an exported graph
//! computes (`Shape`, `Gather`, `Concat`, `Reshape` targets, ...) is either a constant or a
//! constant multiple of the batch size N. Folding with this symbol at load time leaves no
//! integer work for the forward pass: a `Reshape` to `[N, -1]` is resolved once, to `[N, 512]`.

use std::fmt;

/// `k`, or `k·N` where N is the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sym {
    /// The constant factor.
    pub k: i64,
    /// Whether the value is `k·N` rather than `k`.
    pub batch: bool,
}

impl Sym {
    /// The constant `k`.
    pub fn fixed(k: i64) -> Self {
        Self { k, batch: false }
    }

    /// The batch size N.
    pub fn batch() -> Self {
        Self { k: 1, batch: true }
    }

    /// The constant, if it does not involve N.
    pub fn as_fixed(self) -> Option<i64> {
        (!self.batch).then_some(self.k)
    }

    /// Its value for batch size `n`.
    pub fn eval(self, n: usize) -> i64 {
        if self.batch {
            self.k * n as i64
        } else {
            self.k
        }
    }

    /// A dimension's value for batch size `n` (dimensions are never negative).
    pub fn dim(self, n: usize) -> usize {
        self.eval(n).max(0) as usize
    }

    pub fn add(self, o: Self) -> Option<Self> {
        match (self.batch, o.batch) {
            (a, b) if a == b => Some(Self {
                k: self.k.checked_add(o.k)?,
                batch: a,
            }),
            // k·N + 0 and 0 + k·N.
            (true, false) if o.k == 0 => Some(self),
            (false, true) if self.k == 0 => Some(o),
            _ => None,
        }
    }

    pub fn neg(self) -> Self {
        Self {
            k: -self.k,
            batch: self.batch,
        }
    }

    pub fn sub(self, o: Self) -> Option<Self> {
        self.add(o.neg())
    }

    pub fn mul(self, o: Self) -> Option<Self> {
        if self.batch && o.batch {
            return None; // N² never occurs in a classifier's shapes
        }
        if self.k == 0 || o.k == 0 {
            return Some(Self::fixed(0));
        }
        Some(Self {
            k: self.k.checked_mul(o.k)?,
            batch: self.batch || o.batch,
        })
    }

    /// Integer division, exact where N is involved (`6N / 3 = 2N`, `6N / 2N = 3`).
    pub fn div(self, o: Self) -> Option<Self> {
        if o.k == 0 {
            return None;
        }
        match (self.batch, o.batch) {
            // ONNX integer division truncates, as Rust's does.
            (false, false) => Some(Self::fixed(self.k / o.k)),
            (true, false) if self.k % o.k == 0 => Some(Self {
                k: self.k / o.k,
                batch: true,
            }),
            (true, true) if self.k % o.k == 0 => Some(Self::fixed(self.k / o.k)),
            _ => None,
        }
    }

    /// Equality, where decidable for every N ≥ 1.
    pub fn equal(self, o: Self) -> Option<bool> {
        if self.batch == o.batch {
            return Some(self.k == o.k);
        }
        let (b, f) = if self.batch {
            (self.k, o.k)
        } else {
            (o.k, self.k)
        };
        // b·N = f for some N ≥ 1 is impossible when the signs differ or f is 0 and b is not.
        if (b > 0 && f <= 0) || (b < 0 && f >= 0) || (b == 0 && f != 0) {
            Some(false)
        } else {
            None
        }
    }

    /// `self < o` for every N ≥ 1, where decidable.
    pub fn less(self, o: Self) -> Option<bool> {
        let d = o.sub(self)?;
        match d.batch {
            false => Some(d.k > 0),
            true if d.k > 0 => Some(true),
            true => Some(false),
        }
    }
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.batch, self.k) {
            (false, k) => write!(f, "{k}"),
            (true, 1) => write!(f, "N"),
            (true, k) => write!(f, "{k}N"),
        }
    }
}

/// A shape whose dimensions may involve the batch size.
pub(crate) type SymShape = Vec<Sym>;

/// `[a, b, ...]` for messages.
pub(crate) fn show(shape: &[Sym]) -> String {
    let parts: Vec<String> = shape.iter().map(|s| s.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// The number of elements, `k` or `k·N`.
pub(crate) fn numel(shape: &[Sym]) -> Option<Sym> {
    shape.iter().try_fold(Sym::fixed(1), |acc, &d| acc.mul(d))
}

/// ONNX (numpy) multidirectional broadcasting of two shapes.
pub(crate) fn broadcast(a: &[Sym], b: &[Sym]) -> Option<SymShape> {
    let r = a.len().max(b.len());
    let one = Sym::fixed(1);
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                one
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                one
            };
            if da == db || db == one {
                Some(da)
            } else if da == one {
                Some(db)
            } else {
                None
            }
        })
        .collect()
}

/// Resolves an ONNX `Reshape` target (`0` copies the input dimension unless `allowzero`, one
/// `-1` is inferred) against the input shape.
pub(crate) fn reshape_target(
    input: &[Sym],
    target: &[Sym],
    allowzero: bool,
) -> Result<SymShape, String> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        match t.as_fixed() {
            Some(0) if !allowzero => {
                let d = input.get(i).ok_or_else(|| {
                    format!(
                        "target {} copies dimension {i}, which the input lacks",
                        show(target)
                    )
                })?;
                out.push(*d);
            }
            Some(-1) => {
                if infer.replace(i).is_some() {
                    return Err(format!("target {} has more than one -1", show(target)));
                }
                out.push(Sym::fixed(1));
            }
            Some(k) if k < 0 => {
                return Err(format!("target {} has a negative dimension", show(target)))
            }
            _ => out.push(t),
        }
    }
    let total = numel(input).ok_or("the input's size is not linear in the batch size")?;
    let known = numel(&out).ok_or("the target's size is not linear in the batch size")?;
    if let Some(i) = infer {
        out[i] = total
            .div(known)
            .filter(|d| d.mul(known) == Some(total))
            .ok_or_else(|| format!("cannot infer -1: {} elements into {}", total, show(target)))?;
    } else if total != known {
        return Err(format!(
            "{} elements into a target of {} (a batch size baked into the export?)",
            total, known
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_keeps_the_batch_factor() {
        let n = Sym::batch();
        let six_n = n.mul(Sym::fixed(6)).unwrap();
        assert_eq!(six_n.to_string(), "6N");
        assert_eq!(six_n.div(Sym::fixed(3)), Some(Sym { k: 2, batch: true }));
        assert_eq!(six_n.div(n), Some(Sym::fixed(6)));
        assert_eq!(six_n.div(Sym::fixed(4)), None);
        assert_eq!(n.mul(n), None);
        assert_eq!(n.equal(Sym::fixed(-1)), Some(false));
        assert_eq!(n.equal(Sym::fixed(3)), None);
        assert_eq!(n.add(Sym::fixed(0)), Some(n));
        assert_eq!(n.eval(5), 5);
    }

    #[test]
    fn reshape_infers_the_batch() {
        let n = Sym::batch();
        let f = Sym::fixed;
        let input = vec![n, f(64), f(1), f(1)];
        assert_eq!(
            reshape_target(&input, &[n, f(-1)], false).unwrap(),
            vec![n, f(64)]
        );
        assert_eq!(
            reshape_target(&input, &[f(-1), f(64)], false).unwrap(),
            vec![n, f(64)]
        );
        assert_eq!(
            reshape_target(&input, &[f(0), f(-1)], false).unwrap(),
            vec![n, f(64)]
        );
        assert!(reshape_target(&input, &[f(1), f(64)], false).is_err());
        assert_eq!(
            broadcast(&[n, f(3), f(1)], &[f(5)]),
            Some(vec![n, f(3), f(5)])
        );
        assert_eq!(broadcast(&[n, f(3)], &[f(4)]), None);
    }
}
