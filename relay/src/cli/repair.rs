//! `gabp-relay repair`: repair a damaged data dir, after copying it aside.

use anyhow::{bail, Result};
use clap::Args;
use gabp_storage::repair::RepairProgress;

use super::DataDir;

#[derive(Args, Debug)]
pub struct RepairArgs {
    #[command(flatten)]
    pub dir: DataDir,
}

pub fn run(a: RepairArgs) -> Result<()> {
    // The repaired dir and every file RocksDB writes into it stay private.
    gabp_engine::recorder::private_file_modes();
    let dir = &a.dir.data_dir;
    // The copy's bar, then (once the copy is done) the check's.
    let copying = super::progress::Progress::bytes(0, false);
    copying.reading("copying");
    let mut copying = Some(copying);
    let mut checking: Option<super::progress::Progress> = None;
    let r = gabp_storage::repair::repair_with(dir, &mut |p| match p {
        RepairProgress::Copying { bytes, of } => {
            if let Some(bar) = &copying {
                bar.at_of(bytes, of);
            }
        }
        RepairProgress::Checking { frames, of } => {
            if let Some(bar) = copying.take() {
                bar.done();
            }
            checking
                .get_or_insert_with(|| {
                    let bar = super::progress::Progress::frames(of, false);
                    bar.reading("checking");
                    bar
                })
                .at(frames);
        }
    });
    for bar in [copying, checking].into_iter().flatten() {
        bar.done();
    }
    let r = r?;
    let size = gabp_rt::display::bytes;
    super::print_best_effort(&format!(
        "kept an untouched copy at {} ({} files, {})\n",
        r.backup.display(),
        r.before.0,
        size(r.before.1)
    ));
    for step in &r.steps {
        super::print_best_effort(&format!("{step}\n"));
    }
    if !r.lost.is_empty() {
        bail!(
            "repair of {} could not recover everything: {}; the untouched copy is at {}",
            dir.display(),
            r.lost.join("; "),
            r.backup.display()
        );
    }
    super::print_best_effort(&format!(
        "repaired {}: now {} files, {}; {} session(s); {} left recording by a dead relay marked crash; every session checks sound (`gabp-relay sessions check` lists what each holds)\n",
        dir.display(),
        r.after.0,
        size(r.after.1),
        r.sessions,
        r.crashed.len()
    ));
    Ok(())
}
