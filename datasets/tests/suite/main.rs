//! jem-datasets' tests, as one test binary: the loaders against real files and corrupt ones.

mod corrupt_files;
mod loaders;
