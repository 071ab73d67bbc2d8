//! The framing probes of `check-mod`: the header forms a mod reads, a request with raw UTF-8
//! (a mod counting characters waits for bytes that never come: the checker then sends the
//! difference as spaces, which JSON ignores, and an answer then names the defect), large
//! frames, and what the mod itself writes (its header forms, its lengths).

use serde_json::json;
use tokio::time::Instant;

use super::{secs, Answer, Runner, COUNT_BYTES_HINT, UNKNOWN_METHOD};
use crate::report::{count, Check, Verdict};
use crate::wire::{self, Header, Problem};

/// The channel a raw-UTF-8 subscription names: two- and three-byte characters.
const UTF8_CHANNEL: &str = "gabp-check/héllo ✓";

impl Runner<'_> {
    pub(super) async fn check_header_forms(&mut self) {
        // The first connection said hello in the relay's form.
        let mut read = vec![Header::Relay.name()];
        let mut unread = Vec::new();
        for h in [Header::LengthOnly, Header::Lowercase, Header::TypeFirst] {
            match self.open(h).await {
                Ok(p) => {
                    self.close(p).await;
                    read.push(h.name());
                }
                Err(e) => unread.push(format!("{} ({e})", h.name())),
            }
        }
        let c = if unread.is_empty() {
            Check::new(
                "framing.headers-in",
                "§12.2",
                Verdict::Pass,
                format!("hello read in every header form: {}", read.join("; ")),
            )
        } else {
            Check::new(
                "framing.headers-in",
                "§12.2",
                Verdict::Tolerated,
                format!(
                    "not read: {}; the relay writes Content-Length + Content-Type to the mod, whatever a bridge wrote",
                    unread.join("; ")
                ),
            )
            .hint("header names are case-insensitive and Content-Type may come first or not at all: read every header line up to the blank one")
        };
        self.checks.push(c);
    }

    pub(super) async fn check_utf8_request(&mut self) {
        let check = |v, d| Check::new("framing.utf8-request", "§12.2", v, d);
        let mut peer = match self.open(Header::Relay).await {
            Ok(p) => p,
            Err(e) => {
                self.checks
                    .push(check(Verdict::Fail, format!("no connection: {e}")));
                return;
            }
        };
        let id = uuid::Uuid::new_v4().to_string();
        let body = wire::request(
            &id,
            "events/subscribe",
            &json!({ "channels": [UTF8_CHANNEL] }),
        );
        let bytes = body.len();
        let chars = String::from_utf8_lossy(&body).chars().count();
        let said =
            format!("events/subscribe naming {UTF8_CHANNEL:?} ({bytes} bytes, {chars} characters)");
        let wait = self.opts.wait;
        if peer.wire.send(&body, Header::Relay, wait).await.is_err() {
            self.close(peer).await;
            self.checks.push(check(
                Verdict::Fail,
                format!("{said}: the mod stopped reading"),
            ));
            return;
        }
        let first = self.answer_to(&mut peer, &id, Instant::now() + wait).await;
        let c = match first {
            Answer::Msg(_) => check(Verdict::Pass, format!("{said} answered")),
            Answer::TimedOut => {
                // A reader counting characters still waits for this many; spaces after a JSON
                // body change nothing for one counting bytes.
                let missing = bytes - chars;
                let _ = peer.wire.send_raw(&vec![b' '; missing], wait).await;
                let second = self.answer_to(&mut peer, &id, Instant::now() + wait).await;
                let escaped = self.escaped_is_answered().await;
                let and_escaped = if escaped {
                    "; the same request with \\u escapes is answered at once"
                } else {
                    ""
                };
                match second {
                    // Answered once padded, but so slow on an ASCII request too that nothing
                    // tells a slow mod from one counting characters.
                    Answer::Msg(_) if !escaped => check(
                        Verdict::Fail,
                        format!(
                            "{said} got no answer within {} (one came after {missing} more bytes), and the same request with \\u escapes none either: too slow to tell (raise --timeout)",
                            secs(wait)
                        ),
                    ),
                    Answer::Msg(_) => check(
                        Verdict::Fail,
                        format!(
                            "{said} hung until {missing} more bytes came (no answer within {}): the mod counts Content-Length in characters, not bytes, so a request with raw non-ASCII hangs its connection{and_escaped}",
                            secs(wait)
                        ),
                    )
                    .hint(COUNT_BYTES_HINT),
                    _ => {
                        let c = check(
                            Verdict::Fail,
                            format!("{said} was never answered{and_escaped}"),
                        );
                        if escaped {
                            c.hint("the mod mishandles raw UTF-8 in requests; `gabp-relay serve --ascii-requests` sends it non-ASCII as \\uXXXX escapes")
                        } else {
                            c
                        }
                    }
                }
            }
            other => check(
                Verdict::Fail,
                format!("{said}: {}", other.failure(wait).unwrap_or_default()),
            ),
        };
        self.close(peer).await;
        self.checks.push(c);
    }

    /// Whether the raw-UTF-8 probe, its non-ASCII written as `\u` escapes, is answered on a
    /// fresh connection.
    async fn escaped_is_answered(&mut self) -> bool {
        let Ok(mut peer) = self.open(Header::Relay).await else {
            return false;
        };
        let id = uuid::Uuid::new_v4().to_string();
        let body = gabp_proto::message::request(
            &id,
            "events/subscribe",
            json!({ "channels": [UTF8_CHANNEL] }),
        );
        let sent = peer
            .wire
            .send(&body, Header::Relay, self.opts.wait)
            .await
            .is_ok();
        let answered = sent
            && matches!(
                self.answer_to(&mut peer, &id, Instant::now() + self.opts.wait)
                    .await,
                Answer::Msg(_)
            );
        self.close(peer).await;
        answered
    }

    pub(super) async fn check_large(&mut self) {
        let check = |v, d| Check::new("framing.large", "§7.3", v, d);
        let advertised = self.welcome["capabilities"]["limits"]["maxMessageSize"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok());
        let limit = advertised.map_or(self.opts.large, |a| a.min(self.opts.large));
        let mut sizes = vec![64 * 1024, limit];
        sizes.retain(|&s| s <= limit);
        sizes.dedup();
        let mut answered = Vec::new();
        let mut refused: Option<(usize, String)> = None;
        for size in sizes {
            let mut peer = match self.open(Header::Relay).await {
                Ok(p) => p,
                Err(e) => {
                    refused = Some((size, format!("no connection: {e}")));
                    break;
                }
            };
            let id = uuid::Uuid::new_v4().to_string();
            let body = self.padded_request(&id, size);
            let wait = self.opts.wait;
            let sent = peer.wire.send(&body, Header::Relay, wait).await;
            let answer = match sent {
                Ok(()) => self.answer_to(&mut peer, &id, Instant::now() + wait).await,
                Err(_) => Answer::TimedOut,
            };
            self.close(peer).await;
            match answer {
                Answer::Msg(_) => answered.push(size),
                other => {
                    refused = Some((size, other.failure(wait).unwrap_or_default()));
                    break;
                }
            }
        }
        let limits = advertised.map_or_else(
            || "no limits.maxMessageSize advertised".to_string(),
            |a| {
                format!(
                    "limits.maxMessageSize {}",
                    gabp_rt::display::bytes(a as u64)
                )
            },
        );
        let sizes_said = |s: &[usize]| {
            s.iter()
                .map(|&n| gabp_rt::display::bytes(n as u64))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let c = match refused {
            None => check(
                Verdict::Pass,
                format!(
                    "requests of {} answered ({limits})",
                    sizes_said(&answered)
                ),
            ),
            Some((size, why)) if size > 64 * 1024 => check(
                Verdict::Tolerated,
                format!(
                    "a request of {} got {why}, one of 64 KiB an answer ({limits})",
                    gabp_rt::display::bytes(size as u64)
                ),
            )
            .hint("advertise capabilities.limits.maxMessageSize, and serve the mod with --max-body under it: the relay then refuses larger requests from bridges (-32003)"),
            Some((size, why)) => check(
                Verdict::Fail,
                format!(
                    "a request of {}: {why} ({limits})",
                    gabp_rt::display::bytes(size as u64)
                ),
            ),
        };
        self.checks.push(c);
    }

    /// A read request of exactly `size` bytes (less when the envelope alone is longer): a
    /// `tools/list` filtered by one long tag, or the unknown method with a long parameter.
    fn padded_request(&self, id: &str, size: usize) -> Vec<u8> {
        let list = self.tools_list_works;
        let method = if list { "tools/list" } else { UNKNOWN_METHOD };
        let params = |pad: String| {
            if list {
                json!({"filter": {"tags": [pad]}})
            } else {
                json!({ "pad": pad })
            }
        };
        let bare = wire::request(id, method, &params(String::new())).len();
        wire::request(id, method, &params("a".repeat(size.saturating_sub(bare))))
    }

    /// What the mod wrote, over every connection: its lengths (raw UTF-8 counted in bytes?)
    /// and its header forms.
    pub(super) fn check_what_the_mod_writes(&mut self) {
        let seen = &self.log.seen;
        let counted: Vec<&Problem> = seen
            .problems
            .iter()
            .filter(|p| matches!(p, Problem::CharCounted { .. }))
            .collect();
        let c = match counted.first() {
            Some(first) => Check::new(
                "framing.utf8-answer",
                "§12.2",
                Verdict::Fail,
                format!(
                    "{} the mod wrote declared their length in characters, e.g. {first}; a bridge or the relay reading bytes cuts them short and loses the stream",
                    count(counted.len() as u64, "frame")
                ),
            )
            .hint("write Content-Length as the byte count of the UTF-8 body (or escape non-ASCII as \\uXXXX when writing JSON)"),
            None if seen.raw_utf8 > 0 => Check::new(
                "framing.utf8-answer",
                "§12.2",
                Verdict::Pass,
                format!(
                    "{} of {} frames carried raw UTF-8, each framed by its byte count",
                    seen.raw_utf8, seen.frames
                ),
            ),
            None => Check::new(
                "framing.utf8-answer",
                "§12.2",
                Verdict::Pass,
                format!(
                    "all {} frames the mod wrote were ASCII (non-ASCII escaped), so their lengths are exact in bytes and characters alike",
                    seen.frames
                ),
            ),
        };
        self.checks.push(c);
        // Frames broken by interleaving are that defect's (`concurrency.events`), and so are
        // the unreadable bytes that follow them until the reader finds a header again.
        let interleaved = seen
            .problems
            .iter()
            .filter(|p| matches!(p, Problem::Interleaved(_)))
            .count();
        let broken: Vec<&Problem> = seen
            .problems
            .iter()
            .filter(|p| match p {
                Problem::BareLf => true,
                Problem::BadHeader(_) | Problem::NotJson(_) | Problem::Truncated => {
                    interleaved == 0
                }
                _ => false,
            })
            .collect();
        let mut forms: Vec<String> = seen
            .header_forms
            .iter()
            .map(|(form, n)| format!("{form} (×{n})"))
            .collect();
        if let Some(last) = forms.last_mut() {
            *last += &format!(
                "; the largest body {}",
                gabp_rt::display::bytes(seen.largest as u64)
            );
        }
        let c = match broken.first() {
            Some(first) => Check::new(
                "framing.headers-out",
                "§12.2",
                Verdict::Fail,
                format!(
                    "{}, e.g. {first}; headers written: {}",
                    count(broken.len() as u64, "broken frame"),
                    forms.join(", ")
                ),
            )
            .hint("write each frame as `Content-Length: N\\r\\n\\r\\n` and exactly N bytes of JSON"),
            None if interleaved > 0 => Check::new(
                "framing.headers-out",
                "§12.2",
                Verdict::Pass,
                format!(
                    "headers written: {}; the frames broken by interleaving are concurrency.events'",
                    forms.join(", ")
                ),
            ),
            None => Check::new(
                "framing.headers-out",
                "§12.2",
                Verdict::Pass,
                format!("headers written: {}", forms.join(", ")),
            ),
        };
        self.checks.push(c);
    }
}
