//! `vmtierctl completions SHELL` and `vmtierctl man`: generated from the CLI definition.

use std::io::Write as _;

use crate::client::Error;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

pub fn run(mut cmd: clap::Command, a: &Args) {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(a.shell, &mut cmd, name, &mut std::io::stdout());
}

/// The man page (roff) on stdout.
pub fn man(cmd: clap::Command) -> Result<(), Error> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut buf)
        .map_err(Error::Io)?;
    std::io::stdout().write_all(&buf).map_err(Error::Io)
}
