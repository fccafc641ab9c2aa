//! What can go wrong in this crate, as types a caller can match on: an attack that cannot run
//! ([`AttackError`]) and a name on a command line that names nothing ([`UnknownName`]).

/// Why an attack could not run on a batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AttackError {
    /// In a [`Cascade`](crate::Cascade), the outcomes of the attacks before this one do not
    /// cover this attack's ε list and batch.
    #[error(
        "the earlier attacks' outcomes cover {earlier_eps} ε of {earlier_examples:?} examples; \
         this attack runs {eps} ε of {examples}"
    )]
    EarlierOutcomes {
        /// ε the earlier outcomes cover.
        earlier_eps: usize,
        /// Examples per earlier outcome.
        earlier_examples: Vec<usize>,
        /// ε this attack runs.
        eps: usize,
        /// Examples in this attack's batch.
        examples: usize,
    },
    /// A [`Cascade`](crate::Cascade) of no attacks has no outcome to give.
    #[error("the cascade {name} has no attacks")]
    EmptyCascade {
        /// The cascade's name.
        name: String,
    },
    /// An attack defined outside this crate failed, in its own words.
    #[error("{0}")]
    Own(String),
}

impl From<String> for AttackError {
    /// An own attack's failure, as it worded it.
    fn from(message: String) -> Self {
        AttackError::Own(message)
    }
}

/// A name that names no value of its kind (`--norm l3`), with what it could have been.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{found}`: expected {expected}")]
pub struct UnknownName {
    /// The kind of value: `norm`, `attack loss`, `gradient mode`.
    pub what: &'static str,
    /// The name given.
    pub found: String,
    /// The names it takes, as a sentence (`linf or l2`).
    pub expected: &'static str,
}
