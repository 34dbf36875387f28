//! A private tracefs instance for a check: its own ring buffer and event switches, so checks
//! never share (or clear) the global buffer.
//!
//! The testbed boots with the events the checks use already enabled in the top instance
//! (`trace_event=` in tests/testbed/run), so a tracepoint's static key is switched on at boot
//! and stays on: enabling the event in an instance (or attaching a perf event to it, as
//! vmtierd's DAMON source does) then only adds a probe, and no kernel text is patched while
//! the tiered host runs. Under QEMU's multi-threaded TCG a vCPU can keep executing a stale
//! translation of code another vCPU just patched; the testbed saw an `Oops: int3` in
//! `ttwu_do_activate` while a check switched an event off (docs/testbed.md).

use std::fs;
use std::io;
use std::path::PathBuf;

/// Where tracefs is mounted in the testbed.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// A trace instance with some events enabled; removed when dropped.
#[derive(Debug)]
pub struct Instance {
    dir: PathBuf,
    events: Vec<String>,
}

impl Instance {
    /// Creates instance `name` (`vmtier-NAME-PID`) with a buffer of `buffer_kb` per CPU,
    /// recording `events` (`system/event`) of `pid` only when given; tracing is off until
    /// [`Self::on`].
    pub fn new(name: &str, events: &[&str], buffer_kb: u32, pid: Option<u32>) -> io::Result<Self> {
        let dir = PathBuf::from(TRACEFS)
            .join("instances")
            .join(format!("vmtier-{name}-{}", std::process::id()));
        fs::create_dir(&dir)?;
        let me = Self {
            dir,
            events: events.iter().map(|e| (*e).to_owned()).collect(),
        };
        me.write("tracing_on", "0")?;
        me.write("buffer_size_kb", &buffer_kb.to_string())?;
        if let Some(pid) = pid {
            me.write("set_event_pid", &pid.to_string())?;
        }
        for e in events {
            me.write(&format!("events/{e}/enable"), "1")?;
        }
        Ok(me)
    }

    fn write(&self, file: &str, v: &str) -> io::Result<()> {
        fs::write(self.dir.join(file), v)
    }

    /// Records only the `event` (e.g. `migrate/remove_migration_pte`) records that match
    /// `expr` (tracefs filter syntax), decided in the kernel.
    pub fn filter(&self, event: &str, expr: &str) -> io::Result<()> {
        self.write(&format!("events/{event}/filter"), expr)
    }

    /// Starts recording.
    pub fn on(&self) -> io::Result<()> {
        self.write("tracing_on", "1")
    }

    /// Stops recording.
    pub fn off(&self) -> io::Result<()> {
        self.write("tracing_on", "0")
    }

    /// What was recorded, as text.
    pub fn text(&self) -> io::Result<String> {
        fs::read_to_string(self.dir.join("trace"))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.off();
        for e in &self.events {
            let _ = self.write(&format!("events/{e}/enable"), "0");
        }
        let _ = fs::remove_dir(&self.dir);
    }
}
