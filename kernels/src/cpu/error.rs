//! The one error of the CPU kernels: a call that cannot run (the CPU lacks the instructions, a
//! blocking does not fit the tile, an operand does not fit the weight), with a message naming
//! what is wrong. The backends' shells turn it into their own error with the same message.

use std::fmt;

/// A kernel call that cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The kernels' result.
pub type Result<T> = std::result::Result<T, Error>;

/// `return Err(Error(format!(…)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::cpu::Error(format!($($arg)*)))
    };
}
pub(crate) use bail;
