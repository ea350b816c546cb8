//! How a command fails: one sentence with its context, and the exit status that goes with it.

use std::fmt::Display;

/// A failed command. `code` is 2 for bad input, 1 for a job that failed or found no fit.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn bad_input(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: 2,
            error: error.into(),
        }
    }

    pub fn failed(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: 1,
            error: error.into(),
        }
    }

    pub fn failed_msg(message: impl Display) -> Failure {
        Failure {
            code: 1,
            error: anyhow::anyhow!("{message}"),
        }
    }

    pub fn bad_input_msg(message: impl Display) -> Failure {
        Failure::bad_input(anyhow::anyhow!("{message}"))
    }

    /// The error and its causes on one line.
    pub fn render(&self) -> String {
        let mut text = self.error.to_string();
        for cause in self.error.chain().skip(1) {
            let cause = cause.to_string();
            if !text.contains(&cause) {
                text.push_str(": ");
                text.push_str(&cause);
            }
        }
        text
    }
}

pub type CmdResult = Result<(), Failure>;
