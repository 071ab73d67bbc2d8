//! Log lines a peer can cause, kept to a budget per call site: at most `lines` per
//! [`WINDOW`], and the next line that is logged says how many were not. Counters and metrics see
//! every occurrence; the log sees samples. So no peer (a flood of wrong tokens, idle
//! connections, refused requests, reconnect loops) can grow the relay's log without bound,
//! while an operator still sees the first few of each kind at once.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The budget's period.
pub const WINDOW: Duration = Duration::from_secs(10);

/// One call site's budget: a `static` beside the log line it guards.
#[derive(Debug)]
pub struct LogBudget {
    lines: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window_start: Option<Instant>,
    logged: u32,
    not_logged: u64,
}

impl LogBudget {
    /// A budget of `lines` per [`WINDOW`].
    pub const fn new(lines: u32) -> LogBudget {
        LogBudget {
            lines,
            state: parking_lot::const_mutex(State {
                window_start: None,
                logged: 0,
                not_logged: 0,
            }),
        }
    }

    /// `Some(n)` when this occurrence may be logged, `n` being how many were not since the last
    /// one that was; `None` when the window's budget is spent.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        if s.window_start
            .is_none_or(|t| now.duration_since(t) >= WINDOW)
        {
            s.window_start = Some(now);
            s.logged = 0;
        }
        if s.logged < self.lines {
            s.logged += 1;
            Some(std::mem::take(&mut s.not_logged))
        } else {
            s.not_logged += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_logs_its_budget_then_the_next_line_counts_the_rest() {
        let b = LogBudget::new(3);
        let t0 = Instant::now();
        let first: Vec<_> = (0..10).map(|_| b.admit_at(t0)).collect();
        assert_eq!(first[..3], [Some(0), Some(0), Some(0)]);
        assert!(first[3..].iter().all(Option::is_none));
        let later = t0 + WINDOW;
        assert_eq!(b.admit_at(later), Some(7), "the 7 not logged are counted");
        assert_eq!(b.admit_at(later), Some(0));
    }
}
