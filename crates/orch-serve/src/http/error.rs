//! Error answers: `{"error": "one sentence"}` with the status that fits, and the status of each
//! admission [`Refusal`].

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
        };
        ApiError(status, refusal.to_string())
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
}
