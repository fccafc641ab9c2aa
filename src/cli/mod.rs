//! The command line: one flag struct per command (clap), each converting into the library's
//! settings type (`SweepSpec`, `CalibrateSpec`, …) and calling the library, which never sees
//! clap; refused settings come back naming their field, and [`with_flags`] shows them
//! with their flag.

pub mod bench;
pub mod calibrate;
pub mod choices;
pub mod curves;
pub mod defence;
pub mod eval;
pub mod harness;
pub mod lists;
pub mod nonsense;
pub mod ood;
pub mod robust;
pub mod sample;
pub mod train;
pub mod unused;

use jem_bench::settings::InvalidSetting;

/// The flag that sets a settings field in `command` (a subcommand's clap definition): the
/// argument whose id is the field's name (clap's id of a field is its name), shown as its long
/// flag (`ks` → `--steps`, `in_data` → `--in`); `None` where no flag sets it.
pub fn flag_of(command: &clap::Command, field: &str) -> Option<String> {
    let arg = command.get_arguments().find(|a| a.get_id() == field)?;
    Some(format!("--{}", arg.get_long()?))
}

/// An error as the command line shows it: a refused setting of the command's own flags names
/// its flag. (One inside a context, e.g. a reference sweep's settings that `regress` reruns,
/// or a field no flag of `command` sets, keeps its field name.)
pub fn with_flags(e: anyhow::Error, command: &clap::Command) -> anyhow::Error {
    if e.chain().count() > 1 {
        return e;
    }
    match e.downcast::<InvalidSetting>() {
        Ok(invalid) => match flag_of(command, invalid.field) {
            Some(flag) => anyhow::anyhow!(invalid.message_naming(&flag)),
            None => invalid.into(),
        },
        Err(e) => e,
    }
}
