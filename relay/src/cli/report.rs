//! `gabp-relay report`: a recorded session as one self-contained HTML page.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use gabp_storage::Store;

use super::DataDir;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Session id, unique id prefix, or `latest`.
    pub session: String,
    #[command(flatten)]
    pub dir: DataDir,
    /// Where to write the page (`-`: standard output).
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
}

pub fn run(a: ReportArgs) -> Result<()> {
    if !gabp_analysis::export::is_stdout(&a.output) {
        super::export::refuse_the_data_dir(&a.output, &a.dir.data_dir)?;
        super::export::refuse_a_directory(&a.output, "the report is one file", "report.html")?;
    }
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let meta = super::sessions::resolve(&store, &a.session)?;
    let n = gabp_analysis::report::write(&store, &meta, &a.output)
        .with_context(|| format!("writing the report to {}", a.output.display()))?;
    let to = if gabp_analysis::export::is_stdout(&a.output) {
        "the report to stdout".to_string()
    } else {
        a.output.display().to_string()
    };
    let _ = writeln!(
        std::io::stderr(),
        "wrote {to} ({n} bytes) for session {}",
        meta.id
    );
    Ok(())
}
