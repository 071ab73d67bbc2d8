//! `gabp-relay report`: a recorded session as one self-contained HTML page, or a selection of
//! sessions (an experiment) as one page for them all.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use gabp_analysis::export::EpisodeMarks;
use gabp_storage::Store;

use super::select::{select, Filters, Since};
use super::DataDir;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Session ids, unique id prefixes, or `latest` (or select with --all and the filters). One
    /// session named alone gets its own page; a selection gets one page for all its sessions.
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub dir: DataDir,
    #[command(flatten)]
    pub filters: Filters,
    /// Where to write the page (`-`: standard output).
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
    /// The labels of the marks that start and end an episode (an episode runs from a start
    /// mark to the next end mark).
    #[arg(long, value_name = "START,END", value_parser = EpisodeMarks::parse,
          default_value = "episode-start,episode-end")]
    pub episode_marks: EpisodeMarks,
}

/// How the sessions were chosen, as the page's summary says it.
fn describe(a: &ReportArgs) -> String {
    let f = &a.filters;
    let mut parts: Vec<String> = a.sessions.clone();
    if f.all {
        parts.push("--all".into());
    }
    parts.extend(f.route.iter().map(|r| format!("--route {r}")));
    parts.extend(f.tags.iter().map(|(k, v)| format!("--tag {k}={v}")));
    if let Some(app) = &f.app {
        parts.push(format!("--app {app}"));
    }
    match f.since {
        Some(Since::Ago(d)) => {
            let at = gabp_rt::clock::now_ns().saturating_sub(d.as_nanos() as u64);
            parts.push(format!("--since {}", gabp_rt::display::utc(at)));
        }
        Some(Since::At(t)) => parts.push(format!("--since {}", gabp_rt::display::utc(t))),
        None => {}
    }
    parts.join(" ")
}

pub fn run(a: ReportArgs) -> Result<()> {
    if !gabp_analysis::export::is_stdout(&a.output) {
        super::export::refuse_the_data_dir("-o", &a.output, &a.dir.data_dir)?;
        super::export::refuse_a_directory(
            "-o",
            &a.output,
            "the report is one file",
            "report.html",
        )?;
    }
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let to = if gabp_analysis::export::is_stdout(&a.output) {
        "the report to stdout".to_string()
    } else {
        a.output.display().to_string()
    };
    let writing = || format!("writing the report to {}", a.output.display());
    // One session named by id keeps its own page (the form scripts already use); a selection
    // gets the page of the whole selection.
    if a.sessions.len() == 1 && !a.filters.any() {
        let meta = super::sessions::resolve(&store, &a.sessions[0])?;
        let watch = super::progress::Following::reads(&store, meta.frames, false);
        let n = gabp_analysis::report::write(&store, &meta, &a.episode_marks, &a.output)
            .with_context(writing)?;
        drop(watch);
        let _ = writeln!(
            std::io::stderr(),
            "wrote {to} ({n} bytes) for session {}",
            meta.id
        );
        return Ok(());
    }
    let metas = select(&store, &a.sessions, &a.filters, false)?;
    let watch =
        super::progress::Following::reads(&store, metas.iter().map(|m| m.frames).sum(), false);
    let html =
        gabp_analysis::report::selection::render(&store, &metas, &a.episode_marks, &describe(&a))
            .with_context(writing)?;
    drop(watch);
    let n = gabp_analysis::report::write_page(&html, &a.output).with_context(writing)?;
    let sessions = match metas.len() {
        1 => "1 session".to_string(),
        n => format!("{n} sessions"),
    };
    let _ = writeln!(std::io::stderr(), "wrote {to} ({n} bytes) for {sessions}");
    Ok(())
}
