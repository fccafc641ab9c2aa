//! Every checkpoint jem-bench computes with holds finite float32 tensors.
//!
//! PyTorch state_dicts also come in float16, bfloat16 and float64; burn keeps a loaded tensor's
//! type, and the first operation mixing it with float32 then fails deep inside the backend. So
//! weights are converted to f32 where they enter: on import and on every load. A NaN or infinite
//! weight would make every number computed from the model meaningless (an attack "succeeds" on
//! NaN logits, a Fréchet distance comes out huge), so it is found there too.

use std::collections::BTreeSet;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use super::WideResNet;

/// What [`to_f32`] found while converting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precision {
    /// The float types the tensors held before (`f16`, `f32`, …), sorted.
    pub source_dtypes: Vec<String>,
    /// Tensors (by path, `layer1.0.conv1.weight`) holding a NaN or an infinity.
    pub non_finite: Vec<String>,
}

impl Precision {
    /// An error naming `file` and its non-finite tensors, if any.
    pub fn ensure_finite(&self, file: &std::path::Path) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.non_finite.is_empty(),
            "{}: tensor(s) {} hold NaN or infinite values: the model cannot compute (retrain, or \
             take an earlier checkpoint)",
            file.display(),
            self.non_finite
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    }
}

/// Records each float tensor's type and finiteness, and casts it to f32.
#[derive(Default)]
struct ToF32 {
    path: Vec<String>,
    dtypes: BTreeSet<String>,
    non_finite: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for ToF32 {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.map(|t| {
            self.dtypes
                .insert(format!("{:?}", t.dtype()).to_lowercase());
            let t = t.cast(FloatDType::F32);
            let finite = t.clone().is_finite().all().into_data();
            if !finite.iter::<bool>().all(|b| b) {
                self.non_finite.push(self.path.join("."));
            }
            t
        })
    }
}

/// `model` with every float tensor in f32, and what the conversion found.
pub fn to_f32<B: Backend>(model: WideResNet<B>) -> (WideResNet<B>, Precision) {
    let mut mapper = ToF32::default();
    let model = model.map(&mut mapper);
    let found = Precision {
        source_dtypes: mapper.dtypes.into_iter().collect(),
        non_finite: mapper.non_finite,
    };
    (model, found)
}
