//! Progress of long commands (walking frames or sessions) on a terminal: a bar on stderr with
//! frames done of the total the catalog knows, the rate and the time left, the current session
//! named. Off when stderr is not a terminal or `TERM` is `dumb`, under `--json` and with
//! `--quiet`; never on stdout, so `-o -` and piped output stay clean.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: no progress for the rest of the process.
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A bar that follows whatever a store's readers read (export, report, episodes walk frames
/// inside the analysis crate): a thread polls the store's read meter until this is dropped.
pub(crate) struct Following {
    stop: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Following {
    /// A bar over `total` frames read from `store` from now on, shown as [`Progress::frames`]
    /// says; the reads of every session count, the session read last is named.
    pub(crate) fn reads(store: &gabp_storage::Store, total: u64, json: bool) -> Following {
        let progress = Progress::frames(total, json);
        let Some(bar) = progress.bar.clone() else {
            return Following { stop: None };
        };
        let meter = store.read_meter();
        let start = meter.frames();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let mut named = None;
                while !stopped.load(Ordering::Relaxed) {
                    let done = meter.frames().saturating_sub(start);
                    // A reader may walk more than the catalog's count (a pass for marks first).
                    if done > bar.length().unwrap_or(0) {
                        bar.set_length(done);
                    }
                    bar.set_position(done);
                    let now = meter.session();
                    if now != named {
                        named = now;
                        if let Some(id) = now {
                            progress.reading(&id.to_string());
                        }
                    }
                    std::thread::park_timeout(Duration::from_millis(100));
                }
                progress.done();
            });
        Following {
            stop: thread.ok().map(|t| (stop, t)),
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.stop.take() {
            stop.store(true, Ordering::Relaxed);
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// A bar over frames, or nothing when progress is not shown.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar over `total` frames, shown only when stderr is a terminal and `json` is false.
    pub(crate) fn frames(total: u64, json: bool) -> Progress {
        // Under 80 columns with 9-digit counts; the rate in whole frames a second.
        Progress::shown(
            Some(total),
            json,
            "{msg:12} [{bar:16}] {human_pos}/{human_len} frames, {rate}, {eta} left",
        )
    }

    /// A bar over `total` bytes (in binary units), shown as [`Progress::frames`] says.
    pub(crate) fn bytes(total: u64, json: bool) -> Progress {
        Progress::shown(
            Some(total),
            json,
            "{msg:12} [{bar:16}] {binary_bytes}/{binary_total_bytes}, {binary_bytes_per_sec}, {eta} left",
        )
    }

    /// A count with no total (`what`: what it counts), shown as [`Progress::frames`] says.
    pub(crate) fn counting(what: &str) -> Progress {
        let p = Progress::shown(
            None,
            false,
            "{spinner} {human_pos} {msg}, {rate}, {elapsed}",
        );
        if let Some(b) = &p.bar {
            b.set_message(what.to_string());
        }
        p
    }

    fn shown(total: Option<u64>, json: bool, template: &str) -> Progress {
        // A `dumb` terminal cannot redraw a line in place: the bar would print a line a tick.
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        let shown =
            !json && !QUIET.load(Ordering::Relaxed) && !dumb && std::io::stderr().is_terminal();
        let bar = shown.then(|| {
            let pb = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(template)
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

    /// Done so far of a total learnt on the way.
    pub(crate) fn at_of(&self, done: u64, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
            b.set_position(done);
        }
    }

    /// Removes the bar (the command's own output follows).
    pub(crate) fn done(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
