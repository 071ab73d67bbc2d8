//! Episodes cut from marks: an episode is the span from a start mark to the next end mark
//! (labels `episode-start` and `episode-end` unless given). One rule for every reader of a
//! recording that speaks of episodes; it sees only the labels of the marks the relay accepted
//! (`gabp_proto::mark::accepted_mark`), in recording order, and keeps no frames or counts of
//! its own: each reader counts what it wants between the steps this returns.

/// The default label of the mark that starts an episode.
pub const DEFAULT_START: &str = "episode-start";
/// The default label of the mark that ends one.
pub const DEFAULT_END: &str = "episode-end";

/// The labels that start and end an episode (different from each other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeLabels {
    /// The start mark's label.
    pub start: String,
    /// The end mark's label.
    pub end: String,
}

impl Default for EpisodeLabels {
    fn default() -> Self {
        EpisodeLabels {
            start: DEFAULT_START.into(),
            end: DEFAULT_END.into(),
        }
    }
}

impl std::str::FromStr for EpisodeLabels {
    type Err = String;

    /// `START,END`: two different non-empty labels.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(',') {
            Some((a, b))
                if !a.is_empty()
                    && !b.is_empty()
                    && a != b
                    && !b.contains(',')
                    && a.len() <= gabp_proto::mark::MAX_MARK_LABEL
                    && b.len() <= gabp_proto::mark::MAX_MARK_LABEL =>
            {
                Ok(EpisodeLabels {
                    start: a.into(),
                    end: b.into(),
                })
            }
            _ => Err(format!(
                "invalid episode marks {s:?}: expected START,END, two different mark labels (e.g. {DEFAULT_START},{DEFAULT_END})"
            )),
        }
    }
}

/// What a mark does to the episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: another label, or an end mark with no episode open.
    None,
    /// Episode `index` (from 1) starts at this mark. `unfinished`: the episode that was open,
    /// left without its end mark (a run restarted mid-episode), if one was.
    Start {
        /// The new episode's number, from 1 in each session.
        index: u64,
        /// The open episode this start left unfinished.
        unfinished: Option<u64>,
    },
    /// Episode `index` ends at this mark (the mark is its last frame).
    End {
        /// The episode that ended.
        index: u64,
    },
}

/// Follows one session's marks, in recording order.
#[derive(Debug, Clone)]
pub struct Episodes {
    labels: EpisodeLabels,
    started: u64,
    open: Option<u64>,
}

impl Episodes {
    /// Before a session's first mark.
    pub fn new(labels: EpisodeLabels) -> Episodes {
        Episodes {
            labels,
            started: 0,
            open: None,
        }
    }

    /// The next accepted mark, by label.
    pub fn mark(&mut self, label: &str) -> Step {
        if label == self.labels.start {
            self.started += 1;
            let unfinished = self.open.replace(self.started);
            Step::Start {
                index: self.started,
                unfinished,
            }
        } else if label == self.labels.end {
            match self.open.take() {
                Some(index) => Step::End { index },
                None => Step::None,
            }
        } else {
            Step::None
        }
    }

    /// The episode in progress, if one is: at the session's end, it never ended.
    pub fn open(&self) -> Option<u64> {
        self.open
    }

    /// Episodes started so far.
    pub fn started(&self) -> u64 {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_runs_from_a_start_to_the_next_end() {
        let mut e = Episodes::new(EpisodeLabels::default());
        let steps: Vec<Step> = [
            "episode-end",   // nothing open
            "episode-start", // 1
            "checkpoint",
            "episode-end",   // 1 ends
            "episode-end",   // nothing open
            "episode-start", // 2
            "episode-start", // 3, leaving 2 unfinished
            "episode-end",   // 3 ends
            "episode-start", // 4, open at the end
        ]
        .iter()
        .map(|l| e.mark(l))
        .collect();
        assert_eq!(
            steps,
            [
                Step::None,
                Step::Start {
                    index: 1,
                    unfinished: None
                },
                Step::None,
                Step::End { index: 1 },
                Step::None,
                Step::Start {
                    index: 2,
                    unfinished: None
                },
                Step::Start {
                    index: 3,
                    unfinished: Some(2)
                },
                Step::End { index: 3 },
                Step::Start {
                    index: 4,
                    unfinished: None
                },
            ]
        );
        assert_eq!(e.open(), Some(4));
        assert_eq!(e.started(), 4);
    }

    #[test]
    fn labels_are_two_different_names() {
        let l: EpisodeLabels = "go,stop".parse().expect("valid");
        assert_eq!((l.start.as_str(), l.end.as_str()), ("go", "stop"));
        for bad in ["go", "go,go", ",stop", "go,", "a,b,c"] {
            let e = bad.parse::<EpisodeLabels>().expect_err(bad);
            assert_eq!(e.lines().count(), 1);
        }
    }
}
