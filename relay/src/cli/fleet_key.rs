//! `gabp-relay fleet-key`: make a fleet key file, or print a key file's id. The key itself is
//! never printed.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};

use gabp_ship::fleet::{self, FleetKey};

#[derive(Args, Debug)]
pub struct FleetKeyArgs {
    #[command(subcommand)]
    cmd: FleetKeyCmd,
}

#[derive(Subcommand, Debug)]
enum FleetKeyCmd {
    /// Write a new key: 32 random bytes as hex, mode 0600, never over an existing file.
    New {
        /// The key file to create.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
    /// Print a key file's id (not secret: the same on every machine with the same key).
    Id {
        /// The key file.
        file: PathBuf,
    },
}

pub fn run(a: FleetKeyArgs) -> Result<()> {
    match a.cmd {
        FleetKeyCmd::New { output } => {
            let id = fleet::new_key_file(&output).map_err(|e| anyhow!("{e}"))?;
            outln!(
                "wrote fleet key {id} to {}: copy it (mode 0600) to every relay and collector of the fleet",
                output.display()
            );
        }
        FleetKeyCmd::Id { file } => {
            let key = FleetKey::load(&file).map_err(|e| anyhow!("{e}"))?;
            outln!("{}", key.id());
        }
    }
    Ok(())
}
