//! Every list flag (`--eps 0,0.1`, `--steps 0,1`, `--attacks …`) names each value once.
//!
//! A repeated value would compute the same cell twice and count its examples twice (n = 10 for
//! 5 digits), so it is refused for every command, from clap's parse of the command line, before
//! anything runs. Values that read as numbers are compared as the numbers the program computes
//! with: whole numbers as integers, others as `f32` (`0.1`, `0.10` and `0.1000000000001` are
//! one ε, and so are `0` and `1e-50`); other values as written. Lists whose values belong to positions, not to a set (`import
//! --mean 0.5,0.5,0.5`, one per input channel), may repeat.

use clap::{ArgMatches, Command};

/// Flags whose values are one per input channel: a repeat there is a value, not a mistake.
const PER_CHANNEL: [&str; 2] = ["mean", "std"];

/// The first repeated value of any list flag in `matches` (parsed by `command`), as an error
/// that names the flag.
pub fn refuse_repeated_values(command: &Command, matches: &ArgMatches) -> Result<(), String> {
    if let Some((name, sub_matches)) = matches.subcommand() {
        if let Some(sub) = command.find_subcommand(name) {
            refuse_repeated_values(sub, sub_matches)?;
        }
    }
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if PER_CHANNEL.contains(&id) {
            continue;
        }
        let Ok(Some(raw)) = matches.try_get_raw(id) else {
            continue;
        };
        let values: Vec<String> = raw.map(|v| v.to_string_lossy().trim().to_owned()).collect();
        if let Some(value) = first_repeat(&values) {
            let flag = arg
                .get_long()
                .map_or_else(|| id.to_owned(), |long| format!("--{long}"));
            return Err(format!(
                "{flag}: {value} is given twice (as the number the program computes with); \
                 name each value once"
            ));
        }
    }
    Ok(())
}

/// The first value equal to an earlier one: as integers where both read as whole numbers, as
/// `f32` (what every fractional list flag holds) where both read as numbers.
fn first_repeat(values: &[String]) -> Option<&str> {
    let same = |a: &str, b: &str| {
        if let (Ok(x), Ok(y)) = (a.parse::<i128>(), b.parse::<i128>()) {
            return x == y;
        }
        match (a.parse::<f32>(), b.parse::<f32>()) {
            (Ok(x), Ok(y)) => x == y,
            _ => a == b,
        }
    };
    values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].iter().any(|earlier| same(earlier, v)))
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::first_repeat;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn numbers_compare_as_numbers_and_words_as_written() {
        assert_eq!(first_repeat(&strings(&["0", "0.1", "0.10"])), Some("0.10"));
        assert_eq!(
            first_repeat(&strings(&["bpda", "full", "bpda"])),
            Some("bpda")
        );
        assert_eq!(first_repeat(&strings(&["0", "0.1", "0.2"])), None);
        // Equal as the f32 the sweep computes with.
        assert_eq!(
            first_repeat(&strings(&["0", "0.1", "0.1000000000001"])),
            Some("0.1000000000001")
        );
        assert_eq!(first_repeat(&strings(&["0", "1e-50"])), Some("1e-50"));
        // Whole numbers stay integers: 2^24 + 1 is not 2^24 (as f32 it would be).
        assert_eq!(first_repeat(&strings(&["16777216", "16777217"])), None);
        assert_eq!(first_repeat(&strings(&["a/b", "a/c"])), None);
    }
}
