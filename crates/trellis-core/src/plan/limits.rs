//! Size limits applied while parsing, expanding and compiling plans.

/// Size limits applied while parsing and compiling, so a hostile or mistaken input is rejected
/// quickly and with a clear message instead of exhausting memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, checked before parsing.
    pub max_input_bytes: usize,
    pub max_tasks: usize,
    pub max_id_len: usize,
    /// Most `depends_on` entries one task may declare.
    pub max_depends_on: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_input_bytes: 64 * 1024 * 1024,
            max_tasks: 200_000,
            max_id_len: 128,
            max_depends_on: 10_000,
        }
    }
}
