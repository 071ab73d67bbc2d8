//! `gabp-relay episodes`: the episodes of recorded sessions (the spans from a start mark to
//! the next end mark), one row each, printed as each is found.

use std::io::{IsTerminal, Write};

use anyhow::Result;
use clap::Args;
use gabp_analysis::episodes::{for_each_episode, Episode};
use gabp_analysis::export::EpisodeMarks;
use gabp_rt::display;
use gabp_storage::Store;

use super::select::{select, Filters};
use super::{DataDir, Json};

#[derive(Args, Debug)]
pub struct EpisodesArgs {
    /// Session ids, unique id prefixes, or `latest` (or select with --all and the filters).
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub dir: DataDir,
    #[command(flatten)]
    pub filters: Filters,
    /// The labels of the marks that start and end an episode.
    #[arg(long, value_name = "START,END", value_parser = EpisodeMarks::parse,
          default_value = "episode-start,episode-end")]
    pub episode_marks: EpisodeMarks,
    #[command(flatten)]
    pub json: Json,
}

/// Mark data shown in a table cell.
const DATA_CHARS: usize = 32;

pub fn run(a: EpisodesArgs) -> Result<()> {
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let metas = select(&store, &a.sessions, &a.filters, false)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // Streamed: one episode in memory at a time, however many a selection holds.
    if a.json.json {
        write!(out, "{{\"episodes\": [")?;
    } else {
        writeln!(
            out,
            "{:<36}  {:>4}  {:<20} {:>10} {:>12}  {:<11} {:>9} {:>9}  {:<w$}  {:<w$}  EVENTS PER CHANNEL",
            "SESSION",
            "EP",
            "START (UTC)",
            "AT (s)",
            "DURATION (s)",
            "ENDED BY",
            "FRAMES",
            "EVENTS",
            "START DATA",
            "END DATA",
            w = DATA_CHARS
        )?;
    }
    let mut total = 0u64;
    // On a terminal the rows, printed as each episode ends, are the progress: a bar would
    // be redrawn around each of them.
    let watch = super::progress::Following::reads(
        &store,
        metas.iter().map(|m| m.frames).sum(),
        a.json.json || std::io::stdout().is_terminal(),
    );
    for meta in &metas {
        for_each_episode(&store, meta, &a.episode_marks, |e| -> Result<()> {
            if a.json.json {
                let sep = if total == 0 { "" } else { "," };
                write!(out, "{sep}\n{}", e.to_json_line())?;
            } else {
                row(&mut out, e)?;
            }
            total += 1;
            Ok(())
        })?;
    }
    drop(watch);
    if a.json.json {
        writeln!(out, "\n]}}")?;
    }
    out.flush()?;
    if total == 0 && !a.json.json {
        let _ = writeln!(
            std::io::stderr(),
            "no episodes: no mark labelled {:?} in the {} selected session{}",
            a.episode_marks.start,
            metas.len(),
            if metas.len() == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// One table row: every name and datum from the recording escaped for the terminal.
fn row(out: &mut impl Write, e: &Episode) -> Result<()> {
    let data = |d: &Option<String>| {
        d.as_deref()
            .map_or("-".into(), |d| display::text(d, DATA_CHARS))
    };
    let channels: Vec<String> = e
        .channels
        .iter()
        .map(|(c, n)| format!("{}={n}", display::name(c)))
        .collect();
    writeln!(
        out,
        "{:<36}  {:>4}  {:<20} {:>10.3} {:>12.3}  {:<11} {:>9} {:>9}  {:<w$}  {:<w$}  {}",
        e.session,
        e.episode,
        display::utc(e.start_ns),
        e.offset_ms / 1e3,
        e.duration_s,
        e.ended_by.as_str(),
        e.frames,
        e.events,
        data(&e.start_data),
        data(&e.end_data),
        if channels.is_empty() {
            "-".into()
        } else {
            channels.join(" ")
        },
        w = DATA_CHARS
    )?;
    Ok(())
}
