//! The marks of a recording, for seeking and stepping to one (`relay/replay` with `toMark`).
//!
//! One streaming pass over the session parses only bridge frames and keeps, per mark the relay
//! accepted, its frame number, time and label: never a frame body, so memory is bounded by the
//! session's marks (`max_marks`), not its length. Which marks count is `gabp_proto::mark`'s rule,
//! the one `export`, `episodes` and the report use. It reads; it must not run on an async worker.

use std::sync::atomic::{AtomicBool, Ordering};

use gabp_proto::mark::{accepted_mark, MARK};
use gabp_proto::Parser;
use gabp_storage::{Direction, SessionId, Store, StoreError};

/// One accepted mark.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Its frame number in the session.
    pub frame: u64,
    /// When it was recorded (ns since the Unix epoch).
    pub time_ns: u64,
    /// Its label.
    pub label: Box<str>,
}

/// Every accepted mark of a session, in recorded order.
#[derive(Debug, Default)]
pub struct Marks {
    list: Vec<Mark>,
}

impl Marks {
    /// Reads `session`'s marks in one pass; `stop` ends it early (the replay is stopping).
    pub fn build(
        store: &Store,
        session: SessionId,
        stop: &AtomicBool,
    ) -> Result<Marks, StoreError> {
        let mut parser = Parser::new();
        let finder = memchr::memmem::Finder::new(MARK.as_bytes());
        let mut list = Vec::new();
        for item in store.frames(session) {
            let (no, rec) = item?;
            if no % 65_536 == 0 && stop.load(Ordering::Relaxed) {
                break;
            }
            // Only a bridge's requests can be marks; the strict parse is for those naming it.
            if rec.dir != Direction::BridgeToRelay || finder.find(&rec.body).is_none() {
                continue;
            }
            if let Some(label) = accepted_mark(&mut parser, &rec.body) {
                list.push(Mark {
                    frame: no,
                    time_ns: rec.time_ns,
                    label: label.into(),
                });
            }
        }
        list.shrink_to_fit();
        Ok(Marks { list })
    }

    /// The first mark labelled `label` at or after frame `from`.
    pub fn first(&self, label: &str, from: u64) -> Option<&Mark> {
        let start = self.list.partition_point(|m| m.frame < from);
        self.list[start..].iter().find(|m| &*m.label == label)
    }

    /// Marks read.
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_mark_with_a_label_at_or_after_a_frame() {
        let m = |frame, label: &str| Mark {
            frame,
            time_ns: frame * 10,
            label: label.into(),
        };
        let marks = Marks {
            list: vec![m(3, "a"), m(7, "b"), m(9, "a"), m(12, "a")],
        };
        assert_eq!(marks.first("a", 0).map(|m| m.frame), Some(3));
        assert_eq!(marks.first("a", 4).map(|m| m.frame), Some(9));
        assert_eq!(marks.first("a", 9).map(|m| m.frame), Some(9));
        assert_eq!(marks.first("b", 8).map(|m| m.frame), None);
        assert_eq!(marks.first("c", 0).map(|m| m.frame), None);
    }
}
