//! Errors as JSON: `{"error": {"code": "...", "message": "..."}}` with the status that says what
//! went wrong. Bad input is always a 4xx naming what was bad; a 500 means a bug.

use axum::extract::path::ErrorKind as PathErrorKind;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferrymq_broker::BrokerError;

use crate::body::BodyError;
use ferrymq_protocol::ErrorCode;
use serde::Serialize;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// A stable snake_case code: the binary protocol's error codes, plus HTTP's own
    /// (`not_found`, `method_not_allowed`, `unsupported_media_type`, `payload_too_large`).
    pub code: &'static str,
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code, e.g. `unknown_topic`, `invalid_argument`.
    pub code: String,
    /// What was wrong and what to do, for humans.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: a parameter or field is wrong; `field` names it.
    pub fn invalid(field: &str, reason: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument.as_str(),
            format!("invalid {field}: {reason}"),
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A request body that could not be read: too slow (408), no room to buffer it (503), or
    /// cut off (400).
    pub fn from_body_error(error: &(dyn std::error::Error + 'static)) -> Self {
        match BodyError::find(error) {
            Some(found @ BodyError::Timeout(_)) => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                found.to_string(),
            ),
            Some(found @ BodyError::Busy { .. }) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                found.to_string(),
            ),
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the request body: {error}"),
            ),
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(error: BrokerError) -> Self {
        // HTTP names the missing resource; the binary protocol has no code for either.
        match error {
            BrokerError::UnknownUser(_) => {
                return ApiError::new(StatusCode::NOT_FOUND, "unknown_user", error.to_string())
            }
            BrokerError::UnknownToken { .. } => {
                return ApiError::new(StatusCode::NOT_FOUND, "unknown_token", error.to_string())
            }
            BrokerError::UnknownConnection(_) => {
                return ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_connection",
                    error.to_string(),
                )
            }
            _ => {}
        }
        let code = error.code();
        let status = match code {
            ErrorCode::UnknownTopic
            | ErrorCode::UnknownSubscription
            | ErrorCode::UnknownMessage
            | ErrorCode::UnknownConsumer => StatusCode::NOT_FOUND,
            ErrorCode::TopicExists | ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::MessageTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TopicFull | ErrorCode::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::StorageUnavailable | ErrorCode::ShuttingDown | ErrorCode::NotLeader => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorCode::InvalidArgument | ErrorCode::MalformedFrame => StatusCode::BAD_REQUEST,
            ErrorCode::AuthenticationFailed => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, code.as_str(), error.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "this endpoint takes JSON: send Content-Type: application/json",
            ),
            JsonRejection::JsonDataError(e) => ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument.as_str(),
                format!("invalid JSON body: {}", e.body_text()),
            ),
            JsonRejection::JsonSyntaxError(e) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("malformed JSON: {}", e.body_text()),
            ),
            JsonRejection::BytesRejection(e) => match BodyError::find(&e) {
                Some(_) => ApiError::from_body_error(&e),
                None => body_rejection(e.status(), e.body_text()),
            },
            other => ApiError::new(other.status(), "bad_request", other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument.as_str(),
            format!("invalid query string: {}", rejection.body_text()),
        )
    }
}

/// A body that could not be read: too large, or cut off.
pub(crate) fn body_rejection(status: StatusCode, text: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            status,
            "payload_too_large",
            format!("request body too large: {text}"),
        )
    } else {
        ApiError::new(status, "bad_request", text)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(status = %self.status, code = self.code, message = %self.message, "HTTP request failed");
        }
        let (status, busy) = (self.status, self.code == "server_busy");
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        // The rest of a body too slow to read, or refused room, is not read: the connection
        // cannot carry another request.
        if status == StatusCode::REQUEST_TIMEOUT || busy {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // A busy server, or a cluster node whose leader is being elected or is another node.
        if busy || self.code == "not_leader" {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"ferrymq\", Bearer realm=\"ferrymq\""),
            );
        }
        response
    }
}

/// `axum::Json` whose rejections are JSON errors too.
#[derive(Debug, Clone, Copy, Default, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Path` whose rejections are JSON errors too: `invalid_argument`, naming the
/// path segment at fault where there is one.
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(path_rejection(rejection)),
        }
    }
}

fn path_rejection(rejection: PathRejection) -> ApiError {
    if let PathRejection::FailedToDeserializePathParams(failed) = &rejection {
        if let PathErrorKind::InvalidUtf8InPathParam { key } = failed.kind() {
            return ApiError::invalid(key, "not UTF-8 once percent-decoded");
        }
    }
    ApiError::invalid("path", rejection.body_text())
}

/// `axum::extract::Query` whose rejections are JSON errors too.
#[derive(Debug, Clone, Copy, Default, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);
