//! Flags given on the command line that the command's other settings leave unused — a JEM
//! setting of a `--kind baseline` run, the SGLD defence's settings of a sweep without K > 0,
//! a budget of an attack the sweep does not run. They are refused before anything is written:
//! a flag silently ignored reads, in a script or a paper's appendix, as a setting that took
//! effect.

use clap::parser::ValueSource;
use clap::ArgMatches;

/// Flags (clap ids: the settings fields' names) that the command's settings leave unused, and
/// why: what would use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    /// The ids of the flags.
    pub ids: &'static [&'static str],
    /// What uses them, completing "… only": e.g. "a setting of --kind jem".
    pub used_by: String,
}

/// Refuses the flags of `unused` that were given on the command line (not those at their
/// defaults), all of them in one message, each with its long flag and what uses it.
pub fn refuse_given(
    command: &clap::Command,
    matches: &ArgMatches,
    unused: &[Unused],
) -> anyhow::Result<()> {
    let given: Vec<String> = unused
        .iter()
        .flat_map(|u| u.ids.iter().map(move |id| (id, u)))
        .filter(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
        .map(|(id, u)| {
            let flag = super::flag_of(command, id).unwrap_or_else(|| (*id).to_string());
            format!("{flag} is {}", u.used_by)
        })
        .collect();
    anyhow::ensure!(
        given.is_empty(),
        "{}: these settings would not be used; drop the flag{}",
        given.join("; "),
        if given.len() > 1 { "s" } else { "" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Line {
        #[arg(long, default_value_t = 1)]
        used: usize,
        #[arg(long, default_value_t = 2)]
        spare: usize,
        #[arg(long = "other-name")]
        renamed: Option<usize>,
    }

    fn check(args: &[&str]) -> anyhow::Result<()> {
        let command = Line::command();
        let matches = command
            .clone()
            .try_get_matches_from(std::iter::once("line").chain(args.iter().copied()))
            .expect("valid flags");
        Line::from_arg_matches(&matches).expect("parsed");
        let unused = [Unused {
            ids: &["spare", "renamed"],
            used_by: "a setting of --mode x".into(),
        }];
        refuse_given(&command, &matches, &unused)
    }

    #[test]
    fn only_flags_given_on_the_line_are_refused_each_by_its_long_name() {
        check(&[]).expect("defaults are not given flags");
        check(&["--used", "3"]).expect("a used flag");
        let e = check(&["--spare", "2", "--other-name", "1"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--spare is a setting of --mode x; --other-name is a setting of --mode x: these \
             settings would not be used; drop the flags"
        );
    }
}
