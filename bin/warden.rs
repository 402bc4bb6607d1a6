//! warden: the command line and launcher (`warden --help`).

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    warden::cli::run(warden::cli::Cli::parse())
}
