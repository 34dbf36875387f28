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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::Kind;

    fn rule(
        pid: Option<i32>,
        name: Option<&str>,
        mappings: &[&str],
        max_bytes: u64,
    ) -> ProcessRule {
        ProcessRule {
            name: name.map(str::to_owned),
            pid,
            kind: Kind::Cold,
            mappings: mappings.iter().map(|s| (*s).to_owned()).collect(),
            weight: 7,
            max_bytes,
        }
    }

    /// This process's own memfd mapping, found by its maps name (frame numbers need root).
    #[test]
    fn matches_mappings_of_this_process() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let name = format!("vmtier-agent-test-{}", std::process::id());
        let f = {
            let c = std::ffi::CString::new(name.clone()).unwrap();
            // SAFETY: c is a valid NUL-terminated name.
            let fd = unsafe { libc::memfd_create(c.as_ptr(), 0) };
            assert!(fd >= 0);
            // SAFETY: fd was just returned by memfd_create and is owned here.
            unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        };
        f.set_len(5 * PAGE).unwrap();
        let len = usize::try_from(5 * PAGE).unwrap();
        // SAFETY: a shared mapping of the memfd, checked, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let me = std::process::id() as i32;
        let path = format!("/memfd:{name} (deleted)");
        let cases: &[(ProcessRule, u64)] = &[
            (rule(Some(me), None, &[&path], 1 << 30), 5 * PAGE),
            (rule(Some(me), None, &[&path], 2 * PAGE), 2 * PAGE),
            (rule(Some(me), None, &["/no/such/file"], 1 << 30), 0),
            (rule(None, Some("no-such-comm-xyz"), &[], 1 << 30), 0),
        ];
        for (r, want) in cases {
            let found = snapshot(std::slice::from_ref(r));
            let v: Vec<_> = found.hints.iter().map(|h| h.range).collect();
            assert_eq!(ranges::total_bytes(&v), *want, "{r:?}");
            assert!(found
                .hints
                .iter()
                .all(|h| h.kind == Kind::Cold && h.weight == 7));
            assert!(found.errors.is_empty(), "{:?}", found.errors);
        }
        let gone = snapshot(&[rule(Some(i32::MAX), None, &[], 1 << 30)]);
        assert_eq!((gone.hints.len(), gone.errors.len()), (0, 1));
        // SAFETY: the mapping made above, not used afterwards.
        unsafe { libc::munmap(p, len) };
    }
}
