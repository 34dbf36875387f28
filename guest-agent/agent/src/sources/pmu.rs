//! perf samples with physical addresses (`PERF_SAMPLE_PHYS_ADDR`) where the guest has a
//! (v)PMU with a memory-access event: AMD IBS op (`ibs_op` PMU) or Intel `mem-loads`
//! (PEBS load-latency). One system-wide event per CPU; each snapshot reads the ring buffers
//! and sends pages sampled at least `min_samples` times as HOT. Under TCG (no PMU) the
//! probe reports why and the source stays off.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::ptr;
use std::sync::atomic::{fence, Ordering};

use crate::config::PmuConfig;
use crate::ranges::{Hint, Kind, Pfn, PfnRange, Source, PAGE};

const EVENT_SOURCES: &str = "/sys/bus/event_source/devices";
const PERF_SAMPLE_PHYS_ADDR: u64 = 1 << 19;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// Data pages per CPU ring (a power of two) plus one metadata page.
const RING_PAGES: usize = 16;

/// Errors of the PMU source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No PMU event that reports data addresses.
    #[error("No memory-access PMU event: {0}")]
    NoEvent(String),
    /// perf_event_open failed.
    #[error("perf_event_open on CPU {0} failed")]
    Open(i32, #[source] io::Error),
    /// mmap of the ring failed.
    #[error("mmap of the perf ring on CPU {0} failed")]
    Mmap(i32, #[source] io::Error),
}

/// `struct perf_event_attr` up to `config3` (PERF_ATTR_SIZE_VER8, 136 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
    config3: u64,
}

/// The event to sample: PMU type, config, config1, precise level, description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    type_: u32,
    config: u64,
    config1: u64,
    precise: u64,
    /// What it is, for logs.
    pub name: String,
}

fn read_trim(p: &str) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// Parses a sysfs event spec (`event=0xcd,umask=0x1,ldlat=3`) into config and config1.
fn parse_spec(spec: &str) -> Option<(u64, u64)> {
    let (mut config, mut config1) = (0u64, 0u64);
    for kv in spec.split(',') {
        let (k, v) = kv.split_once('=')?;
        let v = v.trim();
        let n = match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok()?,
            None => v.parse().ok()?,
        };
        match k.trim() {
            "event" => config |= n & 0xff,
            "umask" => config |= (n & 0xff) << 8,
            "ldlat" => config1 = n,
            _ => return None,
        }
    }
    Some((config, config1))
}

/// The memory-access event this machine offers, or why there is none.
pub fn probe_event() -> Result<Event, Error> {
    if let Some(t) = read_trim(&format!("{EVENT_SOURCES}/ibs_op/type")).and_then(|t| t.parse().ok())
    {
        return Ok(Event {
            type_: t,
            config: 0,
            config1: 0,
            precise: 0,
            name: "AMD IBS op".into(),
        });
    }
    let cpu = format!("{EVENT_SOURCES}/cpu");
    let Some(t) = read_trim(&format!("{cpu}/type")).and_then(|t| t.parse().ok()) else {
        return Err(Error::NoEvent(format!(
            "no hardware PMU ({cpu} missing: software events only, e.g. TCG or a VM without vPMU)"
        )));
    };
    let Some(spec) = read_trim(&format!("{cpu}/events/mem-loads")) else {
        return Err(Error::NoEvent(format!(
            "{cpu}/events/mem-loads missing (no PEBS load latency)"
        )));
    };
    let (config, config1) = parse_spec(&spec)
        .ok_or_else(|| Error::NoEvent(format!("cannot parse mem-loads spec {spec:?}")))?;
    Ok(Event {
        type_: t,
        config,
        config1: config1.max(3),
        precise: 2,
        name: format!("Intel mem-loads ({spec})"),
    })
}

struct Ring {
    fd: i32,
    base: *mut u8,
    len: usize,
}

/// The sampler: one event and ring per online CPU.
pub struct Pmu {
    event: Event,
    rings: Vec<Ring>,
    cfg: PmuConfig,
    /// Samples read since start.
    pub samples: u64,
}

impl std::fmt::Debug for Pmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmu")
            .field("event", &self.event)
            .field("cpus", &self.rings.len())
            .finish()
    }
}

fn open_event(e: &Event, period: u64, cpu: i32) -> io::Result<i32> {
    let attr = PerfEventAttr {
        type_: e.type_,
        size: u32::try_from(std::mem::size_of::<PerfEventAttr>()).unwrap_or(136),
        config: e.config,
        config1: e.config1,
        sample_period: period,
        sample_type: PERF_SAMPLE_PHYS_ADDR,
        // exclude_hv (bit 6), precise_ip (bits 15-16).
        flags: (1 << 6) | (e.precise << 15),
        wakeup_events: 0,
        ..PerfEventAttr::default()
    };
    // SAFETY: attr is a valid, initialized perf_event_attr of the size it declares; the
    // other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))
}

fn online_cpus() -> Vec<i32> {
    let s = read_trim("/sys/devices/system/cpu/online").unwrap_or_else(|| "0".into());
    let mut v = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
            v.extend(a..=b);
        }
    }
    v
}

impl Pmu {
    /// Probes the event and opens it on every online CPU.
    pub fn start(cfg: &PmuConfig) -> Result<Self, Error> {
        let mut event = probe_event()?;
        let mut pmu = Self {
            event: event.clone(),
            rings: Vec::new(),
            cfg: cfg.clone(),
            samples: 0,
        };
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        for cpu in online_cpus() {
            let fd = match open_event(&event, cfg.sample_period, cpu) {
                Err(e) if event.precise > 1 && e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    event.precise = 1;
                    open_event(&event, cfg.sample_period, cpu)
                }
                r => r,
            }
            .map_err(|e| Error::Open(cpu, e))?;
            let len = (RING_PAGES + 1) * page;
            // SAFETY: mapping a perf event fd read-write, shared, at a kernel-chosen address;
            // the result is checked before use.
            let base = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                // SAFETY: fd was returned by perf_event_open and is not used afterwards.
                unsafe { libc::close(fd) };
                return Err(Error::Mmap(cpu, e));
            }
            pmu.rings.push(Ring {
                fd,
                base: base.cast(),
                len,
            });
        }
        pmu.event = event;
        Ok(pmu)
    }

    /// What it samples.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Reads every ring and returns the hot pages since the last call.
    pub fn snapshot(&mut self) -> Vec<Hint> {
        let mut counts: HashMap<u64, u32> = HashMap::new();
        for r in &self.rings {
            self.samples += drain(r, &mut counts);
        }
        hot_pages(counts, &self.cfg)
    }
}

/// Reads the records between tail and head of one ring, counting sampled pages.
fn drain(r: &Ring, counts: &mut HashMap<u64, u32>) -> u64 {
    // perf_event_mmap_page: data_head at 1024, data_tail 1032, data_offset 1040, data_size 1048.
    // SAFETY: base maps at least one metadata page; these fields lie inside it and are
    // u64-aligned. The kernel updates data_head concurrently: read it volatile, then fence.
    let (head, tail, off, size) = unsafe {
        let m = r.base;
        let head = ptr::read_volatile(m.add(1024).cast::<u64>());
        fence(Ordering::Acquire);
        (
            head,
            ptr::read_volatile(m.add(1032).cast::<u64>()),
            ptr::read_volatile(m.add(1040).cast::<u64>()),
            ptr::read_volatile(m.add(1048).cast::<u64>()),
        )
    };
    let (Ok(off), Ok(size)) = (usize::try_from(off), usize::try_from(size)) else {
        return 0;
    };
    if size == 0 || off.checked_add(size).map_or(true, |e| e > r.len) {
        return 0;
    }
    let byte = |i: u64| -> u8 {
        // SAFETY: off + (i % size) < off + size <= len, inside the mapping.
        unsafe {
            ptr::read_volatile(
                r.base
                    .add(off + usize::try_from(i % size as u64).unwrap_or(0)),
            )
        }
    };
    let u64_at = |i: u64| -> u64 {
        let mut b = [0u8; 8];
        for (k, x) in b.iter_mut().enumerate() {
            *x = byte(i + k as u64);
        }
        u64::from_le_bytes(b)
    };
    let mut pos = tail;
    let mut n = 0;
    while pos + 8 <= head {
        let h = u64_at(pos);
        let typ = (h & 0xffff_ffff) as u32;
        let rsize = h >> 48;
        if rsize < 8 {
            break;
        }
        if typ == PERF_RECORD_SAMPLE && rsize >= 16 {
            let phys = u64_at(pos + 8);
            if phys != 0 {
                *counts.entry(phys / PAGE).or_default() += 1;
                n += 1;
            }
        }
        pos += rsize;
    }
    fence(Ordering::Release);
    // SAFETY: data_tail lies in the metadata page; the kernel reads it after this store.
    unsafe { ptr::write_volatile(r.base.add(1032).cast::<u64>(), head) };
    n
}

/// Pages with at least `min_samples` samples, most sampled first (at most `max_ranges`),
/// as HOT hints sorted by address; weight scaled to the most sampled page.
fn hot_pages(counts: HashMap<u64, u32>, cfg: &PmuConfig) -> Vec<Hint> {
    let mut v: Vec<(u64, u32)> = counts
        .into_iter()
        .filter(|&(_, c)| c >= cfg.min_samples)
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(cfg.max_ranges);
    let top = v.first().map_or(1, |x| x.1).max(1);
    let mut out: Vec<Hint> = v
        .into_iter()
        .map(|(pfn, c)| Hint {
            range: PfnRange {
                start: Pfn(pfn),
                pages: 1,
            },
            kind: Kind::Hot,
            weight: u8::try_from(u64::from(c) * 254 / u64::from(top) + 1).unwrap_or(255),
            source: Source::Pmu,
        })
        .collect();
    out.sort_by_key(|h| h.range.start);
    out
}

impl Drop for Pmu {
    fn drop(&mut self) {
        for r in &self.rings {
            // SAFETY: base/len are the mapping made in start; fd the event opened there;
            // neither is used after this.
            unsafe {
                libc::munmap(r.base.cast(), r.len);
                libc::close(r.fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_has_the_kernel_size() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 136);
    }

    #[test]
    fn parses_event_specs() {
        assert_eq!(parse_spec("event=0xcd,umask=0x1,ldlat=3"), Some((0x1cd, 3)));
        assert_eq!(parse_spec("event=0xd0,umask=0x81"), Some((0x81d0, 0)));
        assert_eq!(parse_spec("event=0xcd,frontend=0x1"), None);
        assert_eq!(parse_spec("garbage"), None);
    }

    #[test]
    fn ranks_sampled_pages() {
        let cfg = PmuConfig {
            min_samples: 2,
            max_ranges: 2,
            ..PmuConfig::default()
        };
        let counts = HashMap::from([(10, 1), (11, 8), (12, 4), (13, 2)]);
        let h = hot_pages(counts, &cfg);
        let got: Vec<_> = h.iter().map(|h| (h.range.start.0, h.weight)).collect();
        assert_eq!(got, vec![(11, 255), (12, 128)]);
    }
}
