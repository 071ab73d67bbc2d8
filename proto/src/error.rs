//! Errors of the wire core, split by whether the byte stream is still in sync.
//!
//! A [`FrameError`] means framing is broken: the reader cannot find the next frame, so the
//! connection must close. An [`EnvelopeError`] means one framed body was bad: the caller answers
//! with an error reply (from a bridge) or records an anomaly (from the mod) and keeps reading.
//! Messages are short and carry no internals (no parser dumps, offsets or paths).

use crate::codes::ErrorCode;

/// Broken framing: the stream is out of sync and the connection must close.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The header section grew past its limit without a blank line.
    #[error("frame header exceeds {limit} bytes")]
    HeaderTooLarge {
        /// The configured header limit in bytes.
        limit: usize,
    },
    /// A header line had no `:` separator or was not ASCII.
    #[error("malformed frame header")]
    MalformedHeader,
    /// No `Content-Length` header was present.
    #[error("missing Content-Length header")]
    MissingLength,
    /// More than one `Content-Length` header was present.
    #[error("duplicate Content-Length header")]
    DuplicateLength,
    /// The `Content-Length` value was not a plain non-negative decimal number.
    #[error("invalid Content-Length value")]
    InvalidLength,
    /// The declared body length exceeds the configured maximum.
    #[error("frame body of {len} bytes exceeds the {limit} byte limit")]
    TooLarge {
        /// The declared length.
        len: u64,
        /// The configured limit.
        limit: usize,
    },
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed mid-frame")]
    Truncated,
    /// An I/O error from the underlying transport.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A framed body that is not an acceptable GABP envelope; the stream is still in sync.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The body is not valid UTF-8.
    #[error("body is not valid UTF-8")]
    InvalidUtf8,
    /// The body is not valid JSON.
    #[error("body is not valid JSON")]
    InvalidJson,
    /// The body is JSON but not an object.
    #[error("message must be a JSON object")]
    NotAnObject,
    /// A number is not finite (it overflows a double).
    #[error("non-finite number: beyond a double's range (magnitude above about 1.8e308, as is any integer of 310 digits or more)")]
    NonFiniteNumber,
    /// Arrays and objects nest deeper than the relay reads (127 levels, the frame's own object
    /// included: serde_json's limit).
    #[error("nesting deeper than 127 levels")]
    TooDeep,
    /// A string escape names a lone surrogate (`"\ud800"`), which no decoder can represent.
    #[error("lone surrogate in a string escape")]
    LoneSurrogate,
    /// An object repeats a key.
    #[error("duplicate key \"{0}\"")]
    DuplicateKey(String),
    /// The envelope has a field the schema does not allow for its type.
    #[error("unexpected field \"{0}\"")]
    UnknownField(String),
    /// A required field is missing.
    #[error("missing field \"{0}\"")]
    MissingField(&'static str),
    /// A field has the wrong JSON type or an invalid value.
    #[error("invalid field \"{0}\"")]
    InvalidField(&'static str),
    /// `v` is not `gabp/1`.
    #[error("unsupported protocol version")]
    WrongVersion,
    /// `type` is not request, response or event.
    #[error("invalid message type")]
    InvalidType,
    /// A response carries both or neither of `result` and `error`.
    #[error("response must carry exactly one of result and error")]
    ResultAndError,
    /// Method parameters are invalid for a method whose schema the relay enforces.
    #[error("invalid params: {0}")]
    InvalidParams(&'static str),
}

impl EnvelopeError {
    /// The wire error code for this rejection.
    pub fn code(&self) -> ErrorCode {
        match self {
            EnvelopeError::InvalidParams(_) => ErrorCode::InvalidParams,
            _ => ErrorCode::InvalidRequest,
        }
    }
}
