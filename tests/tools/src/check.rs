//! Assertion bookkeeping: TAP-like lines, counted.

use std::fmt::Display;
use std::process::Command;
use std::process::ExitCode;

/// How times measured here should be read, from the accelerator the testbed really used
/// (`VMTIER_ACCEL`, set by tests/testbed/run): `TCG-emulated` (ratios within one run only),
/// `KVM`, or `host` outside the testbed.
pub fn clock() -> &'static str {
    match std::env::var("VMTIER_ACCEL").as_deref() {
        Ok("tcg") => "TCG-emulated",
        Ok("kvm") => "KVM",
        _ => "host",
    }
}

/// Runs `cmd` to completion: (exit status 0, stdout then stderr, trimmed), or (false, the
/// reason it could not start).
pub fn output(cmd: &mut Command) -> (bool, String) {
    match cmd.output() {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
            .trim()
            .to_owned(),
        ),
        Err(e) => (false, format!("{:?}: {e}", cmd.get_program())),
    }
}

/// Counts and prints assertions.
#[derive(Debug, Default)]
pub struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    /// Records one assertion; returns `ok` so callers can stop early.
    pub fn check(&mut self, ok: bool, name: &str, detail: impl Display) -> bool {
        if ok {
            self.passed += 1;
            println!("ok - {name}: {detail}");
        } else {
            self.failed += 1;
            println!("not ok - {name}: {detail}");
        }
        ok
    }

    /// Records a failure that prevents further checks.
    pub fn fatal(&mut self, name: &str, detail: impl Display) {
        self.check(false, name, detail);
    }

    /// Checks failed so far.
    #[cfg(test)]
    pub fn failed(&self) -> u32 {
        self.failed
    }

    /// Prints the summary and turns it into an exit code.
    pub fn finish(self) -> ExitCode {
        println!("{} passed, {} failed", self.passed, self.failed);
        if self.failed == 0 && self.passed > 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
