//! GABP 1.0 wire core: framing, envelope view, rewrites and wire error codes.
//!
//! This crate owns everything about the bytes on the wire and nothing about sockets or runtimes.
//!
//! - [`codec`]: the LSP-style `Content-Length` framing as a tokio-util `Decoder`/`Encoder`.
//! - [`scan`]: a top-level JSON object scanner that finds the byte spans of envelope fields.
//! - [`envelope`]: one validating scan per frame into a small borrowed [`EnvelopeView`], with
//!   strict (bridge) and tolerant (mod) validation.
//! - [`params`]: parameter checks for the methods whose schemas the relay enforces.
//! - [`rewrite`]: in-place id rewrites and seq replacement, so forwarding never re-serializes.
//! - [`splice`]: members added to a received object (the welcome's extensions) byte for byte.
//! - [`message`]: builders for the frames the relay writes itself (errors, events, requests).
//! - [`codes`]: the wire error codes.
//! - [`mark`]: `relay/mark`: its bounds and which marks the relay accepts.
//! - [`matching`]: how a replay matches a request to a recorded one, and which requests are an
//!   agent's calls (the replay and the call check share it).
//! - [`error`]: framing errors (stream out of sync) and envelope errors (stream still in sync).
#![warn(missing_docs)]

pub mod codec;
pub mod codes;
pub mod envelope;
pub mod error;
pub mod mark;
pub mod matching;
pub mod message;
pub use envelope::params;
pub mod rewrite;
pub mod scan;
pub mod splice;

pub use codec::{
    encode_frame, encode_header, frame_bytes, Frame, GabpCodec, SkippingCodec, DEFAULT_MAX_BODY,
    DEFAULT_MAX_HEADER,
};
pub use codes::ErrorCode;
pub use envelope::{answer_id, EnvelopeView, Mode, MsgType, Parser, ANSWER_KEYS};
pub use error::{EnvelopeError, FrameError};

/// The protocol version string every GABP 1.x envelope carries in `v`.
pub const PROTOCOL_VERSION: &str = "gabp/1";
