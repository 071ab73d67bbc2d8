//! Which episode a frame belongs to: the one rule the export's `episode` column, `--episode N`
//! and `gabp-relay episodes` share.
//!
//! An episode runs from a start mark to the next end mark, both included (labels
//! [`EpisodeMarks`], `episode-start` and `episode-end` unless told otherwise). Episodes are
//! numbered from 1 in the order they start. A start mark while an episode is open begins the
//! next one (the open one ends there, without an end mark: an agent that restarted a run
//! mid-way); an end mark with no episode open belongs to none; an episode still open when the
//! session ends runs to the session's end. [`Tracker`] applies this to one session's frames in
//! order, in constant memory; it reads no frames itself.

/// The labels of the marks that start and end an episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeMarks {
    /// The start mark's label.
    pub start: String,
    /// The end mark's label.
    pub end: String,
}

/// The default start label.
pub const DEFAULT_START: &str = "episode-start";
/// The default end label.
pub const DEFAULT_END: &str = "episode-end";

impl Default for EpisodeMarks {
    fn default() -> Self {
        EpisodeMarks {
            start: DEFAULT_START.into(),
            end: DEFAULT_END.into(),
        }
    }
}

impl EpisodeMarks {
    /// `START,END`: two different, non-empty labels.
    pub fn parse(s: &str) -> Result<EpisodeMarks, String> {
        let Some((start, end)) = s.split_once(',') else {
            return Err(format!(
                "invalid episode marks {s:?}: expected START,END (e.g. {DEFAULT_START},{DEFAULT_END})"
            ));
        };
        let bad =
            |l: &str| l.is_empty() || l.len() > gabp_proto::mark::MAX_MARK_LABEL || l.contains(',');
        if bad(start) || bad(end) {
            return Err(format!(
                "invalid episode marks {s:?}: both labels must be non-empty, at most {} bytes and without commas",
                gabp_proto::mark::MAX_MARK_LABEL
            ));
        }
        if start == end {
            return Err(format!(
                "invalid episode marks {s:?}: the start and end labels must differ"
            ));
        }
        Ok(EpisodeMarks {
            start: start.into(),
            end: end.into(),
        })
    }
}

/// What one frame did to the episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// The episode the frame belongs to (numbered from 1).
    pub episode: Option<u64>,
    /// The frame is a start mark that cut the open episode short: that one ended just before
    /// this frame, without an end mark.
    pub cut: bool,
    /// The frame is the start mark of [`Step::episode`].
    pub begins: bool,
    /// The frame is the end mark of [`Step::episode`].
    pub ends: bool,
}

/// Follows one session's episodes frame by frame.
#[derive(Debug, Clone)]
pub struct Tracker {
    marks: EpisodeMarks,
    /// Episodes begun so far.
    begun: u64,
    open: bool,
}

impl Tracker {
    /// Before a session's first frame.
    pub fn new(marks: EpisodeMarks) -> Tracker {
        Tracker {
            marks,
            begun: 0,
            open: false,
        }
    }

    /// The next frame in order, with its label when it is a mark the relay accepted.
    pub fn step(&mut self, mark: Option<&str>) -> Step {
        if mark == Some(self.marks.start.as_str()) {
            let cut = self.open;
            self.begun += 1;
            self.open = true;
            return Step {
                episode: Some(self.begun),
                cut,
                begins: true,
                ends: false,
            };
        }
        if !self.open {
            return Step::default();
        }
        let ends = mark == Some(self.marks.end.as_str());
        self.open = !ends;
        Step {
            episode: Some(self.begun),
            cut: false,
            begins: false,
            ends,
        }
    }

    /// Episodes begun so far.
    pub fn begun(&self) -> u64 {
        self.begun
    }

    /// The episode open now, if one is.
    pub fn open(&self) -> Option<u64> {
        self.open.then_some(self.begun)
    }

    /// The labels followed.
    pub fn marks(&self) -> &EpisodeMarks {
        &self.marks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_run_from_a_start_to_the_next_end() {
        let mut t = Tracker::new(EpisodeMarks::default());
        let frames = [
            None,
            Some("episode-end"), // no episode open: belongs to none
            Some("episode-start"),
            None,
            Some("note"),
            Some("episode-end"),
            None,
            Some("episode-start"),
            Some("episode-start"), // cuts the second short
            None,
        ];
        let got: Vec<Step> = frames.iter().map(|m| t.step(*m)).collect();
        let eps: Vec<Option<u64>> = got.iter().map(|s| s.episode).collect();
        assert_eq!(
            eps,
            [
                None,
                None,
                Some(1),
                Some(1),
                Some(1),
                Some(1),
                None,
                Some(2),
                Some(3),
                Some(3)
            ]
        );
        assert!(got[2].begins && !got[2].cut);
        assert!(got[5].ends);
        assert!(got[8].begins && got[8].cut);
        assert_eq!(t.begun(), 3);
        assert_eq!(t.open(), Some(3), "the last one is still open");
    }

    #[test]
    fn marks_are_two_different_labels() {
        assert_eq!(
            EpisodeMarks::parse("go,stop").expect("valid"),
            EpisodeMarks {
                start: "go".into(),
                end: "stop".into()
            }
        );
        for bad in ["go", "go,", ",stop", "go,go", "a,b,c"] {
            let e = EpisodeMarks::parse(bad).expect_err(bad);
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
