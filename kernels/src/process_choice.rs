//! A choice the whole process shares — whose kernels, which instruction set, which GPU
//! convolution — set at run time by a flag, an environment variable or a test, and read by
//! every thread on each call.

use std::sync::atomic::{AtomicU8, Ordering};

/// One of `values`, or nothing yet, shared by every thread of the process.
pub(crate) struct ProcessChoice<T: 'static> {
    /// 0 while nothing is chosen, else 1 + the chosen value's index in `values`.
    chosen: AtomicU8,
    values: &'static [T],
}

impl<T: Copy + PartialEq> ProcessChoice<T> {
    /// Nothing chosen yet among `values` (at most 255 of them).
    pub(crate) const fn new(values: &'static [T]) -> Self {
        Self {
            chosen: AtomicU8::new(0),
            values,
        }
    }

    /// Chooses `value`, one of the values this choice was made with.
    pub(crate) fn set(&self, value: T) {
        let index = self
            .values
            .iter()
            .position(|v| *v == value)
            .expect("a process-wide choice is set to one of its own values");
        self.chosen.store(index as u8 + 1, Ordering::Relaxed);
    }

    /// The value chosen last, if any.
    pub(crate) fn get(&self) -> Option<T> {
        match self.chosen.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.values[usize::from(n) - 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_chosen_until_set_and_the_last_value_set_is_read_back() {
        static CHOICE: ProcessChoice<char> = ProcessChoice::new(&['a', 'b', 'c']);
        assert_eq!(CHOICE.get(), None);
        CHOICE.set('c');
        assert_eq!(CHOICE.get(), Some('c'));
        CHOICE.set('a');
        assert_eq!(CHOICE.get(), Some('a'));
    }
}
