//! The command line's values of a [`Choice`] flag (`--attacks`, `--scores`, `--kind`, …): every
//! value's name, with its description as the help of that value, from the type's own list.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use jem_bench::Choice;

/// A parser that accepts the names of `T`'s values (and lists them, described, in `--help`).
pub fn choices<T: Choice + Send + Sync + Clone>() -> impl TypedValueParser<Value = T> {
    let values = T::ALL
        .iter()
        .map(|value| PossibleValue::new(value.name()).help(value.description()));
    PossibleValuesParser::new(values).map(|name| T::parse(&name).expect("one of the listed names"))
}
