//! jem-kernels' tests, as one test binary: the kernels against burn's own operations and their
//! autodiff gradients, and every instruction-set cap against the portable path.

mod against_burn;
mod isa;
mod leaky_relu;
