//! Settings that take one of a fixed set of named values (an attack, an OOD score, a training
//! objective, …). Each such type lists its values once, with the name the command line, the
//! settings files and the CSV files use and a sentence saying what it is; the command line
//! builds its choices and help from them, and names parse back through [`Choice::parse`].

/// A setting with a fixed set of named values.
pub trait Choice: Copy + PartialEq + Sized + 'static {
    /// What one value is called in errors: `attack`, `score`, ….
    const WHAT: &'static str;

    /// Every value, in the order the command line lists them.
    const ALL: &'static [Self];

    /// The value's name (`apgd-ce`, `max-softmax`, …), unique within the type.
    fn name(self) -> &'static str;

    /// What the value is, in a sentence (the command line's help shows it).
    fn description(self) -> &'static str;

    /// The value named `name`, in any case; the error lists every name.
    fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|value| name.eq_ignore_ascii_case(value.name()))
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                format!(
                    "unknown {} {name:?}: expected one of {}",
                    Self::WHAT,
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::Choice;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Colour {
        Red,
        DarkBlue,
    }

    impl Choice for Colour {
        const WHAT: &'static str = "colour";
        const ALL: &'static [Self] = &[Colour::Red, Colour::DarkBlue];
        fn name(self) -> &'static str {
            match self {
                Colour::Red => "red",
                Colour::DarkBlue => "dark-blue",
            }
        }
        fn description(self) -> &'static str {
            "a colour"
        }
    }

    #[test]
    fn a_name_parses_back_in_any_case_and_an_unknown_one_lists_every_name() {
        assert_eq!(Colour::parse("dark-blue"), Ok(Colour::DarkBlue));
        assert_eq!(Colour::parse("RED"), Ok(Colour::Red));
        assert_eq!(
            Colour::parse("green"),
            Err("unknown colour \"green\": expected one of red, dark-blue".to_string())
        );
    }
}
