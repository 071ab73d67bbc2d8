//! `gabp-relay sessions prune --retain SIZE|AGE [--dry-run]`: the one command that deletes
//! sessions in bulk. It applies the rule `serve --retain` applies (the same plan and the same
//! deletion, [`gabp_storage::retention`]), lists every session it deletes, each written out
//! before it goes, and sums up what it freed.
//!
//! It must never delete a session it has not listed, nor touch a data dir a relay holds, a
//! disk without room or one written read-only (refused as `sessions rm` is). `--dry-run` reads
//! only: it works while a relay records and changes nothing.

use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, Result};
use clap::Args;
use gabp_storage::retention::{Deletable, Expired, RetentionPlan, RetentionRule};
use gabp_storage::Store;
use serde_json::json;

use crate::config::Retention;
use gabp_rt::display;

/// `sessions prune`'s flags.
#[derive(Args, Debug, Clone)]
pub struct PruneArgs {
    /// Delete ended sessions older than AGE and/or the oldest while all hold more than SIZE:
    /// 7d, 10GiB or 7d,10GiB, as `serve --retain` takes.
    #[arg(long, value_name = "SIZE|AGE", value_parser = retention)]
    pub retain: Retention,
    /// List what would be deleted and delete nothing (reads only: works while a relay records).
    #[arg(long)]
    pub dry_run: bool,
    /// Also delete sessions no shipping destination has whole (in a data dir that ships,
    /// they are kept by default, as `serve --retain` keeps them).
    #[arg(long)]
    pub retain_unshipped: bool,
}

fn retention(s: &str) -> Result<Retention, String> {
    let r: Retention = s.parse()?;
    if r.max_age.is_none() && r.max_bytes.is_none() {
        return Err("give an age, a size or both, like 7d, 10GiB or 7d,10GiB".into());
    }
    Ok(r)
}

pub fn run(dir: &Path, a: &PruneArgs, json: bool) -> Result<()> {
    let store = if a.dry_run {
        Store::open_for_reading(dir)?
    } else {
        super::sessions::open_to_change(dir)?
    };
    let rule = RetentionRule {
        now_ns: gabp_rt::clock::now_ns(),
        max_age_ns: a.retain.max_age.map(|d| d.as_nanos() as u64),
        max_bytes: a.retain.max_bytes,
        deletable: if !a.retain_unshipped && ships(&store)? {
            Deletable::ShippedAnywhere
        } else {
            Deletable::Ended
        },
    };
    let plan = store.retention_plan(&rule)?;
    let held_by = if a.dry_run {
        gabp_storage::dir::lock_holder(dir)
    } else {
        None
    };
    if a.dry_run {
        return report(&plan, &plan.expired, None, held_by, json, None);
    }
    let disk_before = disk_bytes(dir);
    if !json && !plan.expired.is_empty() {
        header()?;
    }
    let mut deleted = Vec::new();
    let mut failed = None;
    for e in &plan.expired {
        // Said before it is deleted: a closed stdout stops the command before the session goes.
        if !json {
            row(e)?;
        }
        if let Err(err) = store.delete_session(e.meta.id) {
            failed = Some(anyhow!(
                "could not delete session {} ({} deleted before it): {err}",
                e.meta.id,
                deleted.len()
            ));
            break;
        }
        deleted.push(e.clone());
    }
    // Closed, RocksDB has let go of every file the deletions made obsolete.
    drop(store);
    let disk = Some((disk_before, disk_bytes(dir)));
    report(&plan, &deleted, disk, None, json, failed.as_ref())?;
    failed.map_or(Ok(()), Err)
}

/// Whether the data dir ships its recordings (some session has a ship cursor): then, as in a
/// relay that ships, a session no destination has whole is kept.
fn ships(store: &Store) -> Result<bool> {
    for m in store.sessions()? {
        if !store.ship_cursors(m.id)?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

fn header() -> Result<()> {
    outln!(
        "{:<36}  {:<12} {:<20} {:>10}  WHY",
        "SESSION",
        "ROUTE",
        "START (UTC)",
        "SIZE"
    );
    Ok(())
}

fn row(e: &Expired) -> Result<()> {
    outln!(
        "{:<36}  {:<12} {:<20} {:>10}  {}",
        e.meta.id,
        display::name(&e.meta.route),
        display::utc(e.meta.started_ns),
        display::bytes(e.meta.bytes),
        e.why()
    );
    Ok(())
}

/// The summary (after the rows, printed as the sessions went) or the JSON document: what was
/// (or, in a dry run, would be) deleted, recorded bytes before and after, the data dir on disk
/// before and after (`disk`, not for a dry run), and what the rule kept.
fn report(
    plan: &RetentionPlan,
    done: &[Expired],
    disk: Option<(u64, u64)>,
    held_by: Option<u32>,
    json: bool,
    failed: Option<&anyhow::Error>,
) -> Result<()> {
    let dry_run = disk.is_none();
    let bytes: u64 = done.iter().map(|e| e.meta.bytes).sum();
    let after = plan.before_bytes - bytes;
    if json {
        let sessions: Vec<_> = done
            .iter()
            .map(|e| {
                json!({
                    "id": e.meta.id.to_string(), "route": e.meta.route,
                    "startedNs": e.meta.started_ns, "startedAt": display::utc(e.meta.started_ns),
                    "endedNs": e.meta.ended_ns, "bytes": e.meta.bytes, "why": e.why(),
                })
            })
            .collect();
        let mut v = json!({
            "dryRun": dry_run,
            "sessions": sessions,
            "count": done.len(),
            "bytes": bytes,
            "recordedBytesBefore": plan.before_bytes,
            "recordedBytesAfter": after,
            "diskBytesBefore": disk.map(|d| d.0),
            "diskBytesAfter": disk.map(|d| d.1),
            "keptRecording": plan.kept_recording,
            "keptUnshipped": plan.kept_unshipped,
        });
        if let Some(pid) = held_by {
            v["heldByPid"] = pid.into();
        }
        if let Some(e) = failed {
            v["error"] = super::one_line(e).into();
        }
        return super::print_json(&v);
    }
    if dry_run && !done.is_empty() {
        header()?;
        for e in done {
            row(e)?;
        }
    }
    let n = done.len();
    let mut line = format!(
        "{} {n} session{} ({}); recordings {} before, {} after",
        if dry_run { "would delete" } else { "deleted" },
        if n == 1 { "" } else { "s" },
        display::bytes(bytes),
        display::bytes(plan.before_bytes),
        display::bytes(after),
    );
    match disk {
        Some((before, after)) => {
            line += &format!(
                "; data dir {} on disk before, {} after",
                display::bytes(before),
                display::bytes(after)
            )
        }
        None => line += "; nothing deleted (--dry-run)",
    }
    if plan.kept_recording > 0 {
        line += &format!(
            "; kept {} still recording (or left so by a crash: gabp-relay repair ends them)",
            plan.kept_recording
        );
    }
    if plan.kept_unshipped > 0 {
        line += &format!(
            "; kept {} no shipping destination has whole (--retain-unshipped deletes them)",
            plan.kept_unshipped
        );
    }
    if let Some(pid) = held_by {
        line +=
            &format!("; a relay (pid {pid}) holds the data dir: pruning is refused until it stops");
    }
    outln!("{line}");
    Ok(())
}

/// Bytes the data dir's files take on disk (allocated blocks: write-ahead logs are
/// preallocated), subdirectories included, links not followed.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            total += disk_bytes(&e.path());
        } else if m.is_file() {
            total += m.blocks() * 512;
        }
    }
    total
}
