//! Wire error codes: JSON-RPC's, the relay's own (-32000..-32099), and the ecosystem's -310xx.
//!
//! This is the only place numeric codes are defined; other crates name them through [`ErrorCode`].

/// An error code carried in a GABP error response.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// -32600: the body is not a valid GABP envelope (including invalid UTF-8 or JSON: GABP
    /// defines no parse-error code, so bad JSON is an invalid request).
    InvalidRequest,
    /// -32601: the method does not exist or is not available.
    MethodNotFound,
    /// -32602: the method's parameters are invalid.
    InvalidParams,
    /// -32603: an internal error; the message never carries internals.
    InternalError,
    /// -32000: the mod is not connected, so the request could not be forwarded.
    ModUnavailable,
    /// -32001: the request was forwarded but its outcome is unknown (mod gone or timeout).
    OutcomeUnknown,
    /// -32002: a per-bridge or global limit was reached (pending requests, subscriptions).
    LimitExceeded,
    /// -32003: the frame exceeds the configured size limit.
    TooLarge,
    /// -32004: a replayed session has no recorded response matching this request.
    NoRecordedResponse,
    /// -32005: the relay is shutting down.
    ShuttingDown,
    /// -32006: the bridge's identity may not do this (its role or tool globs); the message
    /// names the rule.
    Forbidden,
    /// -32007: the bridge is over its `calls_per_second`; `error.data.retryAfterMs` says when
    /// to try again.
    SlowDown,
    /// -32008: the tool is leased and this bridge does not hold the route's `relay/lease`.
    LeaseHeld,
    /// -31000: the session token was wrong (ecosystem convention).
    BadToken,
    /// -31001: a request arrived before a successful `session/hello` (ecosystem convention).
    NoSession,
}

impl ErrorCode {
    /// The numeric code written on the wire.
    pub const fn code(self) -> i64 {
        match self {
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::ModUnavailable => -32000,
            ErrorCode::OutcomeUnknown => -32001,
            ErrorCode::LimitExceeded => -32002,
            ErrorCode::TooLarge => -32003,
            ErrorCode::NoRecordedResponse => -32004,
            ErrorCode::ShuttingDown => -32005,
            ErrorCode::Forbidden => -32006,
            ErrorCode::SlowDown => -32007,
            ErrorCode::LeaseHeld => -32008,
            ErrorCode::BadToken => -31000,
            ErrorCode::NoSession => -31001,
        }
    }

    /// The code for a numeric value, if it is one of ours.
    pub fn from_code(code: i64) -> Option<ErrorCode> {
        const ALL: [ErrorCode; 15] = [
            ErrorCode::InvalidRequest,
            ErrorCode::MethodNotFound,
            ErrorCode::InvalidParams,
            ErrorCode::InternalError,
            ErrorCode::ModUnavailable,
            ErrorCode::OutcomeUnknown,
            ErrorCode::LimitExceeded,
            ErrorCode::TooLarge,
            ErrorCode::NoRecordedResponse,
            ErrorCode::ShuttingDown,
            ErrorCode::Forbidden,
            ErrorCode::SlowDown,
            ErrorCode::LeaseHeld,
            ErrorCode::BadToken,
            ErrorCode::NoSession,
        ];
        ALL.into_iter().find(|c| c.code() == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sit_in_their_ranges() {
        for code in [
            -32600, -32601, -32602, -32603, -32000, -32001, -32005, -32006, -32007, -32008, -31000,
            -31001,
        ] {
            let c = ErrorCode::from_code(code).expect("known code");
            assert_eq!(c.code(), code);
        }
        assert_eq!(ErrorCode::from_code(-1), None);
        assert!((-32099..=-32000).contains(&ErrorCode::LimitExceeded.code()));
    }
}
