//! jem-kernels' tests, as one test binary: the kernels against burn's own operations and their
//! autodiff gradients. The instruction-set caps are tested in `tests/isa.rs`, a binary of its
//! own: the cap is process-wide, and would change what the tests beside it compute.

mod adam;
mod against_burn;
mod leaky_relu;
