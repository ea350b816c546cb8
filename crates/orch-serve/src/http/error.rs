//! Error answers: `{"error": "one sentence"}` with the status that fits, and the status of each
//! admission [`Refusal`] (a submission's too, [`crate::core::submit::Error`]).

use crate::core::admission::Refusal;
use crate::http::wire::ErrorBody;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

/// A refused admission answers with the status that says why.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let status = match &refusal {
            Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::OverLimit(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::NotFound(_) => StatusCode::NOT_FOUND,
        };
        ApiError(status, refusal.to_string())
    }
}

/// A submission not taken: a refusal with its status, or the daemon's own failure (500).
impl From<crate::core::submit::Error> for ApiError {
    fn from(e: crate::core::submit::Error) -> ApiError {
        match e {
            crate::core::submit::Error::Refused(refusal) => refusal.into(),
            crate::core::submit::Error::Failed(why) => internal(why),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn err(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

pub(crate) fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!("{e}");
    err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_answers_with_its_status_and_sentence() {
        for (refusal, status) in [
            (Refusal::Invalid("a".into()), StatusCode::BAD_REQUEST),
            (Refusal::Forbidden("b".into()), StatusCode::FORBIDDEN),
            (
                Refusal::OverLimit("c".into()),
                StatusCode::TOO_MANY_REQUESTS,
            ),
            (
                Refusal::Unavailable("d".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ] {
            let sentence = refusal.to_string();
            let ApiError(got, message) = refusal.into();
            assert_eq!((got, message), (status, sentence));
        }
    }

    #[test]
    fn a_submission_refused_or_failed_answers_404_for_an_unknown_job_and_500_for_the_daemon() {
        let ApiError(status, message) = crate::core::submit::Error::Refused(Refusal::NotFound(
            "job.toml: after_ok names job 9".into(),
        ))
        .into();
        assert_eq!(
            (status, message.as_str()),
            (StatusCode::NOT_FOUND, "job.toml: after_ok names job 9")
        );
        let ApiError(status, message) =
            crate::core::submit::Error::Failed("the disk broke".into()).into();
        assert_eq!(
            (status, message.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "the disk broke")
        );
    }
}
