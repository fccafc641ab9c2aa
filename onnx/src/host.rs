//! Load-time tensors: weights, constants, and the shape values that fold before any forward
//! pass (integers as [`Sym`], so that they may involve the batch size).

use crate::sym::Sym;

/// The elements of a [`HostTensor`], row-major.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostData {
    Float(Vec<f32>),
    Int(Vec<Sym>),
    Bool(Vec<bool>),
}

/// A tensor known at load time.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HostTensor {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    pub fn float(shape: Vec<usize>, data: Vec<f32>) -> Self {
        Self {
            shape,
            data: HostData::Float(data),
        }
    }

    pub fn int(shape: Vec<usize>, data: Vec<Sym>) -> Self {
        Self {
            shape,
            data: HostData::Int(data),
        }
    }

    /// A 1-D tensor of constant integers.
    pub fn ints(values: &[i64]) -> Self {
        Self::int(
            vec![values.len()],
            values.iter().map(|&v| Sym::fixed(v)).collect(),
        )
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn len(&self) -> usize {
        match &self.data {
            HostData::Float(v) => v.len(),
            HostData::Int(v) => v.len(),
            HostData::Bool(v) => v.len(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.data {
            HostData::Float(_) => "float",
            HostData::Int(_) => "integer",
            HostData::Bool(_) => "bool",
        }
    }

    /// The values as floats (integers converted; fails where one involves N).
    pub fn to_f32(&self) -> Result<Vec<f32>, String> {
        match &self.data {
            HostData::Float(v) => Ok(v.clone()),
            HostData::Int(v) => v
                .iter()
                .map(|s| {
                    s.as_fixed()
                        .map(|k| k as f32)
                        .ok_or_else(|| "depends on the batch size".to_string())
                })
                .collect(),
            HostData::Bool(v) => Ok(v.iter().map(|&b| b as u8 as f32).collect()),
        }
    }

    /// The values as symbolic integers (floats must be integral).
    pub fn to_syms(&self) -> Result<Vec<Sym>, String> {
        match &self.data {
            HostData::Int(v) => Ok(v.clone()),
            HostData::Float(v) => v
                .iter()
                .map(|&f| {
                    if f.fract() == 0.0 && f.abs() < 9.0e15 {
                        Ok(Sym::fixed(f as i64))
                    } else {
                        Err(format!("{f} is not an integer"))
                    }
                })
                .collect(),
            HostData::Bool(v) => Ok(v.iter().map(|&b| Sym::fixed(b as i64)).collect()),
        }
    }

    /// The values as constant integers (none may involve N).
    pub fn to_i64(&self) -> Result<Vec<i64>, String> {
        self.to_syms()?
            .into_iter()
            .map(|s| {
                s.as_fixed()
                    .ok_or_else(|| "depends on the batch size".to_string())
            })
            .collect()
    }

    /// The single value of a one-element tensor, as a float.
    pub fn scalar_f32(&self) -> Result<f32, String> {
        match self.to_f32()?.as_slice() {
            [v] => Ok(*v),
            v => Err(format!("expected one value, found {}", v.len())),
        }
    }

    /// Same elements, another shape.
    pub fn reshaped(mut self, shape: Vec<usize>) -> Self {
        self.shape = shape;
        self
    }

    /// Elements picked by flat index (the building block of the layout ops below).
    fn pick(&self, shape: Vec<usize>, index: impl Iterator<Item = usize>) -> Self {
        let data = match &self.data {
            HostData::Float(v) => HostData::Float(index.map(|i| v[i]).collect()),
            HostData::Int(v) => HostData::Int(index.map(|i| v[i]).collect()),
            HostData::Bool(v) => HostData::Bool(index.map(|i| v[i]).collect()),
        };
        Self { shape, data }
    }

    /// The element at flat index `i` broadcast to `shape` (a flat index into it).
    fn broadcast_index(&self, out_shape: &[usize], flat: usize) -> usize {
        let r = out_shape.len();
        let off = r - self.shape.len();
        let (mut idx, mut rem, mut stride) = (0, flat, 1);
        for d in (0..r).rev() {
            let coord = rem % out_shape[d];
            rem /= out_shape[d];
            if d >= off {
                let size = self.shape[d - off];
                if size != 1 {
                    idx += coord * stride;
                }
                stride *= size;
            }
        }
        idx
    }

    /// This tensor broadcast to `shape` (assumed compatible).
    pub fn broadcast_to(&self, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        self.pick(
            shape.to_vec(),
            (0..n).map(|i| self.broadcast_index(shape, i)),
        )
    }

    /// Axis permutation.
    pub fn transpose(&self, perm: &[usize]) -> Self {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let strides = strides(&self.shape);
        let n = self.numel();
        let index = (0..n).map(|flat| {
            let (mut rem, mut src) = (flat, 0);
            for d in (0..shape.len()).rev() {
                src += (rem % shape[d]) * strides[perm[d]];
                rem /= shape[d];
            }
            src
        });
        self.pick(shape.clone(), index)
    }

    /// Elements `starts[a] + i·steps[a]` along every axis (`len[a]` of them).
    pub fn slice(&self, starts: &[i64], steps: &[i64], lens: &[usize]) -> Self {
        let strides = strides(&self.shape);
        let n: usize = lens.iter().product();
        let index = (0..n).map(|flat| {
            let (mut rem, mut src) = (flat, 0i64);
            for d in (0..lens.len()).rev() {
                let i = (rem % lens[d]) as i64;
                rem /= lens[d];
                src += (starts[d] + i * steps[d]) * strides[d] as i64;
            }
            src as usize
        });
        self.pick(lens.to_vec(), index)
    }

    /// Elements at `indices` (already non-negative) along `axis`; the axis is replaced by the
    /// indices' shape.
    pub fn gather(&self, axis: usize, indices: &[usize], indices_shape: &[usize]) -> Self {
        let outer: usize = self.shape[..axis].iter().product();
        let inner: usize = self.shape[axis + 1..].iter().product();
        let dim = self.shape[axis];
        let mut shape = self.shape[..axis].to_vec();
        shape.extend_from_slice(indices_shape);
        shape.extend_from_slice(&self.shape[axis + 1..]);
        let index = (0..outer).flat_map(move |o| {
            indices
                .iter()
                .flat_map(move |&i| (0..inner).map(move |j| (o * dim + i) * inner + j))
        });
        let index: Vec<usize> = index.collect();
        self.pick(shape, index.into_iter())
    }

    /// Concatenation along `axis` (same kind and compatible shapes assumed).
    pub fn concat(parts: &[&HostTensor], axis: usize) -> Result<Self, String> {
        let first = parts.first().ok_or("nothing to concatenate")?;
        let outer: usize = first.shape[..axis].iter().product();
        let mut shape = first.shape.clone();
        shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let mut data = match first.data {
            HostData::Float(_) => HostData::Float(Vec::new()),
            HostData::Int(_) => HostData::Int(Vec::new()),
            HostData::Bool(_) => HostData::Bool(Vec::new()),
        };
        for o in 0..outer {
            for p in parts {
                let block: usize = p.shape[axis..].iter().product();
                let range = o * block..(o + 1) * block;
                match (&mut data, &p.data) {
                    (HostData::Float(d), HostData::Float(s)) => d.extend_from_slice(&s[range]),
                    (HostData::Int(d), HostData::Int(s)) => d.extend_from_slice(&s[range]),
                    (HostData::Bool(d), HostData::Bool(s)) => d.extend_from_slice(&s[range]),
                    _ => return Err("concatenating tensors of different types".into()),
                }
            }
        }
        Ok(Self { shape, data })
    }
}

/// Row-major strides of a shape.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Numpy broadcasting of two constant shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (da, db) {
                _ if da == db => Some(da),
                (1, _) => Some(db),
                (_, 1) => Some(da),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(shape: Vec<usize>) -> HostTensor {
        let n = shape.iter().product::<usize>();
        HostTensor::ints(&(0..n as i64).collect::<Vec<_>>()).reshaped(shape)
    }

    fn values(t: &HostTensor) -> Vec<i64> {
        t.to_i64().unwrap()
    }

    #[test]
    fn layout_ops() {
        let t = iota(vec![2, 3]);
        assert_eq!(values(&t.transpose(&[1, 0])), vec![0, 3, 1, 4, 2, 5]);
        // Reversed: start at the end, step -1 (how PyTorch writes F.pad's pads).
        assert_eq!(
            values(&t.slice(&[1, 2], &[-1, -1], &[2, 3])),
            vec![5, 4, 3, 2, 1, 0]
        );
        assert_eq!(values(&t.gather(1, &[2, 0], &[2])), vec![2, 0, 5, 3]);
        assert_eq!(values(&t.gather(0, &[1], &[])), vec![3, 4, 5]);
        let c = HostTensor::concat(&[&t, &iota(vec![2, 1])], 1).unwrap();
        assert_eq!(c.shape, vec![2, 4]);
        assert_eq!(values(&c), vec![0, 1, 2, 0, 3, 4, 5, 1]);
        let b = iota(vec![3]).broadcast_to(&[2, 3]);
        assert_eq!(values(&b), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
    }
}
