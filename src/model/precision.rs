//! Every checkpoint jem-bench computes with holds float32 tensors. PyTorch state_dicts also come
//! in float16, bfloat16 and float64; burn keeps a loaded tensor's type, and the first operation
//! mixing it with float32 then fails deep inside the backend. So weights are converted to f32
//! where they enter: on import and on every load.

use std::collections::BTreeSet;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use super::WideResNet;

/// Records each float tensor's type and casts it to f32.
struct ToF32 {
    found: BTreeSet<String>,
}

impl<B: Backend> ModuleMapper<B> for ToF32 {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.map(|t| {
            self.found.insert(format!("{:?}", t.dtype()).to_lowercase());
            t.cast(FloatDType::F32)
        })
    }
}

/// `model` with every float tensor in f32, and the float types it held before (`["f16"]`,
/// `["f32"]`, …), sorted.
pub fn to_f32<B: Backend>(model: WideResNet<B>) -> (WideResNet<B>, Vec<String>) {
    let mut mapper = ToF32 {
        found: BTreeSet::new(),
    };
    let model = model.map(&mut mapper);
    (model, mapper.found.into_iter().collect())
}
