//! Progress of long commands (walking frames or sessions) on a terminal: a bar on stderr with
//! frames done of the total the catalog knows, the rate and the time left, the current session
//! named. Off when stderr is not a terminal or `TERM` is `dumb`, under `--json` and with `--quiet`; never on
//! stdout, so `-o -` and piped output stay clean.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: no progress for the rest of the process.
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A bar over frames, or nothing when progress is not shown.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar over `total` frames, shown only when stderr is a terminal and `json` is false.
    pub(crate) fn frames(total: u64, json: bool) -> Progress {
        // A `dumb` terminal cannot redraw a line in place: the bar would print a line a tick.
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        let shown =
            !json && !QUIET.load(Ordering::Relaxed) && !dumb && std::io::stderr().is_terminal();
        let bar = shown.then(|| {
            let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            // Under 80 columns with 9-digit counts; the rate in whole frames a second.
            let style = ProgressStyle::with_template(
                "{msg:12} [{bar:16}] {human_pos}/{human_len} frames, {rate}, {eta} left",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{}/s", HumanCount(s.per_sec() as u64));
            })
            .progress_chars("=> ");
            pb.set_style(style);
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        Progress { bar }
    }

    /// Names what is being read now (cut to 12 characters: a session id's first two groups).
    pub(crate) fn reading(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.chars().take(12).collect::<String>());
        }
    }

    /// Frames done so far, in all.
    pub(crate) fn at(&self, frames: u64) {
        if let Some(b) = &self.bar {
            b.set_position(frames);
        }
    }

    /// Removes the bar (the command's own output follows).
    pub(crate) fn done(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
