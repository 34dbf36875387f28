//! `[[process]]` rules: the resident pages of matching processes (by `comm` or pid, in the
//! chosen mappings), translated to guest-physical ranges through pagemap, sent as the
//! rule's kind (hot, cold or pinned).

use std::fs;

use crate::config::ProcessRule;
use crate::pagemap::{self, MAX_PAGES};
use crate::ranges::{self, Hint, Source, PAGE};

/// What one snapshot of the rules found.
#[derive(Debug, Default)]
pub struct Found {
    /// The hints.
    pub hints: Vec<Hint>,
    /// Processes matched.
    pub processes: usize,
    /// Translation errors (process gone, pagemap hidden), for the log.
    pub errors: Vec<String>,
}

/// Pids whose comm equals `name`.
fn pids_named(name: &str) -> Vec<i32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .collect()
}

/// Applies every rule once.
pub fn snapshot(rules: &[ProcessRule]) -> Found {
    let mut found = Found::default();
    for rule in rules {
        let pids = match (&rule.name, rule.pid) {
            (_, Some(p)) => vec![p],
            (Some(n), None) => pids_named(n),
            (None, None) => Vec::new(),
        };
        for pid in pids {
            match process_frames(pid, rule) {
                Ok(frames) => {
                    found.processes += 1;
                    found
                        .hints
                        .extend(ranges::coalesce(frames).into_iter().map(|range| Hint {
                            range,
                            kind: rule.kind,
                            weight: rule.weight,
                            source: Source::Process,
                        }));
                }
                Err(e) => found.errors.push(format!("pid {pid}: {e}")),
            }
        }
    }
    found
}

fn process_frames(pid: i32, rule: &ProcessRule) -> Result<Vec<u64>, pagemap::Error> {
    let maps = pagemap::mappings(pid).map_err(|e| pagemap::Error::Open(pid, e))?;
    let max_pages = rule.max_bytes / PAGE;
    // Scanning absent pages costs too: at most four times the pages that may be sent.
    let mut scan_left = max_pages.saturating_mul(4);
    let mut frames = Vec::new();
    for m in maps {
        let name = if m.path.is_empty() { "anon" } else { &m.path };
        if m.path == "[vsyscall]"
            || (!rule.mappings.is_empty() && !rule.mappings.iter().any(|x| x == name))
        {
            continue;
        }
        let mut a = m.start;
        while a < m.end && scan_left > 0 && (frames.len() as u64) < max_pages {
            let pages = ((m.end - a) / PAGE).min(MAX_PAGES).min(scan_left);
            if pages == 0 {
                break;
            }
            let got = pagemap::translate(pid, a, pages * PAGE)?;
            frames.extend(got);
            scan_left -= pages;
            a += pages * PAGE;
        }
    }
    frames.truncate(usize::try_from(max_pages).unwrap_or(usize::MAX));
    Ok(frames)
}
