//! Why a job could not run: every step of the lifecycle (prepare, place, start, wait) fails
//! with a [`RunError`].

use crate::place::PlaceError;
use orch_exec::ExecError;
use orch_trainer::TrainError;

/// Why a job could not run (its own failure is an [`Outcome`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Device(String),
    #[error("{0}")]
    BadInput(String),
}

impl RunError {
    /// The user's input is at fault (exit 2), not the machine or the job.
    pub fn is_bad_input(&self) -> bool {
        match self {
            RunError::Place(PlaceError::BadInput(_)) | RunError::BadInput(_) => true,
            RunError::Train(e) => e.is_bad_input(),
            RunError::Exec(ExecError::EmptyCommand) => true,
            _ => false,
        }
    }
}
