//! The agent's run loop: sources, snapshots, the port and the app socket, one thread,
//! driven by poll(2).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::app::AppServer;
use crate::config::Config;
use crate::port;
use crate::ranges::{self, source_name, Hint, Kind, PfnRange, Source, PAGE};
use crate::session::{bye_reason, Event, Session};
use crate::sources::{damon::Damon, free, pmu::Pmu, process};

/// Set by SIGTERM/SIGINT.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM/SIGINT handlers and ignores SIGPIPE.
pub fn install_signals() {
    // SAFETY: on_signal only stores to an atomic (async-signal-safe); a zeroed sigaction
    // with sa_sigaction set is a valid argument; SIG_IGN for SIGPIPE is always valid.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Whether a stop was requested.
pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Errors of the run loop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The port could not be found or opened.
    #[error("Host channel")]
    Port(#[from] port::Error),
    /// The app socket could not be set up.
    #[error("App socket")]
    App(#[from] crate::app::Error),
    /// poll(2) failed.
    #[error("poll failed")]
    Poll(#[source] io::Error),
    /// `--once`: no WELCOME in time.
    #[error("No WELCOME from the host within {0} ms")]
    NoWelcome(u64),
    /// `--once`: the host ended the session.
    #[error("The host ended the session: BYE {0}")]
    Bye(u32),
    /// `--once`: the frames did not leave in time.
    #[error("Snapshot not sent within {0} ms")]
    NotSent(u64),
}

/// Logs a message at most once a minute per key (plus how many were suppressed).
#[derive(Debug, Default)]
pub struct RateLog {
    last: HashMap<String, (Instant, u64)>,
}

impl RateLog {
    /// Logs `msg` as a warning unless `key` was logged within the last minute.
    pub fn warn(&mut self, key: &str, msg: &str) {
        let now = Instant::now();
        let e = self
            .last
            .entry(key.to_owned())
            .or_insert((now - Duration::from_secs(120), 0));
        if now.duration_since(e.0) >= Duration::from_secs(60) {
            if e.1 > 0 {
                log::warn!("{msg} ({} more since the last report)", e.1);
            } else {
                log::warn!("{msg}");
            }
            *e = (now, 0);
        } else {
            e.1 += 1;
        }
    }
}

/// Per-source outcome of one snapshot.
#[derive(Clone, Debug, Default)]
pub struct SourceReport {
    /// Ranges produced.
    pub ranges: usize,
    /// Bytes covered.
    pub bytes: u64,
    /// Error, if the source failed this time.
    pub error: Option<String>,
}

/// The hint sources that could be started.
#[derive(Debug, Default)]
pub struct Sources {
    free: Option<crate::config::FreePagesConfig>,
    rules: Vec<crate::config::ProcessRule>,
    damon: Option<Damon>,
    pmu: Option<Pmu>,
    /// Why a configured source is off.
    pub unavailable: Vec<(Source, String)>,
}

impl Sources {
    /// Starts every enabled source; those that fail are listed in `unavailable`.
    pub fn start(cfg: &Config) -> Self {
        let mut s = Sources::default();
        if cfg.free_pages.enabled {
            match free::probe(std::path::Path::new(free::KPAGEFLAGS)) {
                Ok(()) => s.free = Some(cfg.free_pages.clone()),
                Err(e) => s.unavailable.push((Source::FreePages, chain(&e))),
            }
        }
        s.rules = cfg.process.clone();
        if cfg.damon.enabled {
            match Damon::start(&cfg.damon) {
                Ok(d) => {
                    log::info!("guest DAMON: paddr kdamond {} on", d.slot());
                    s.damon = Some(d);
                }
                Err(e) => s.unavailable.push((Source::GuestDamon, chain(&e))),
            }
        }
        if cfg.pmu.enabled {
            match Pmu::start(&cfg.pmu) {
                Ok(p) => {
                    log::info!("pmu: sampling {}", p.event().name);
                    s.pmu = Some(p);
                }
                Err(e) => s.unavailable.push((Source::Pmu, chain(&e))),
            }
        }
        for (src, why) in &s.unavailable {
            log::info!("source {} unavailable: {why}", source_name(*src));
        }
        s
    }

    /// Collects every source's hints now. `app` adds the app socket's marks.
    pub fn snapshot(
        &mut self,
        app: Option<&mut AppServer>,
    ) -> (Vec<Hint>, Vec<(Source, SourceReport)>) {
        let mut hints = Vec::new();
        let mut reports = Vec::new();
        let mut report = |src: Source, h: &[Hint], error: Option<String>| {
            let v: Vec<PfnRange> = h.iter().map(|h| h.range).collect();
            reports.push((
                src,
                SourceReport {
                    ranges: h.len(),
                    bytes: ranges::total_bytes(&v),
                    error,
                },
            ));
        };
        if let Some(f) = &self.free {
            match free::scan(
                std::path::Path::new(free::KPAGEFLAGS),
                f.min_range_bytes / PAGE,
            ) {
                Ok(r) => {
                    let h: Vec<Hint> = ranges::keep_largest(r, f.max_ranges)
                        .into_iter()
                        .map(|range| Hint {
                            range,
                            kind: Kind::Free,
                            weight: f.weight,
                            source: Source::FreePages,
                        })
                        .collect();
                    report(Source::FreePages, &h, None);
                    hints.extend(h);
                }
                Err(e) => report(Source::FreePages, &[], Some(chain(&e))),
            }
        }
        if let Some(app) = app {
            let h = app.hints();
            report(Source::App, &h, None);
            hints.extend(h);
        }
        if !self.rules.is_empty() {
            let found = process::snapshot(&self.rules);
            let err = (!found.errors.is_empty()).then(|| found.errors.join("; "));
            report(Source::Process, &found.hints, err);
            hints.extend(found.hints);
        }
        if let Some(d) = &self.damon {
            match d.snapshot() {
                Ok(h) => {
                    report(Source::GuestDamon, &h, None);
                    hints.extend(h);
                }
                Err(e) => report(Source::GuestDamon, &[], Some(chain(&e))),
            }
        }
        if let Some(p) = &mut self.pmu {
            let h = p.snapshot();
            report(Source::Pmu, &h, None);
            hints.extend(h);
        }
        (hints, reports)
    }

    /// Stops what needs stopping (the kdamond).
    pub fn stop(&mut self) {
        if let Some(d) = self.damon.take() {
            d.stop();
        }
        self.pmu = None;
    }
}

/// An error with its causes, `: `-joined.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut c = e.source();
    while let Some(x) = c {
        s.push_str(": ");
        s.push_str(&x.to_string());
        c = x.source();
    }
    s
}

/// How the loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Until SIGTERM.
    Daemon,
    /// One snapshot, then BYE and exit (`--once`), with this time limit in ms.
    Once(u64),
}

struct Port {
    path: PathBuf,
    file: Option<File>,
    /// The host end is connected (virtio-serial reports POLLHUP while it is not).
    connected: bool,
    next_check: Instant,
}

impl Port {
    fn check(&mut self, now: Instant, log: &mut RateLog) {
        if now < self.next_check {
            return;
        }
        self.next_check = now + Duration::from_secs(1);
        if self.file.is_none() {
            match port::open(&self.path) {
                Ok(f) => {
                    log::info!("host channel {} open", self.path.display());
                    self.file = Some(f);
                }
                Err(e) => {
                    log.warn("port-open", &chain(&e));
                    return;
                }
            }
        }
        let Some(f) = &self.file else { return };
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: p is one valid pollfd; timeout 0 does not block.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        self.connected = n >= 0 && p.revents & (libc::POLLHUP | libc::POLLERR) == 0;
    }
}

/// Runs the agent until stopped (daemon) or one snapshot is sent (`--once`).
pub fn run(cfg: &Config, port_path: PathBuf, mode: Mode) -> Result<(), Error> {
    let start = Instant::now();
    let mut log = RateLog::default();
    let mut port = Port {
        path: port_path,
        file: None,
        connected: false,
        next_check: start,
    };
    if mode != Mode::Daemon {
        port.file = Some(port::open(&port.path)?);
    }
    let mut app = match (mode, cfg.app.enabled) {
        (Mode::Daemon, true) => {
            let a = AppServer::bind(&cfg.app)?;
            log::info!("app socket {} listening", cfg.app.socket.display());
            Some(a)
        }
        _ => None,
    };
    let mut sources = Sources::start(cfg);
    let mut s = Session::new(
        &cfg.agent.name,
        cfg.agent.max_frames_per_s,
        cfg.agent.max_bytes_per_s,
        start,
    );
    let interval = Duration::from_millis(cfg.agent.interval_ms);
    let hello_retry = Duration::from_millis(cfg.agent.hello_retry_ms);
    let mut epoch = 0u64;
    let mut next_snapshot: Option<Instant> = None;
    let mut hello_not_before = start;
    let mut last_status = start;
    let mut once_sent = false;
    let result = 'main: loop {
        let now = Instant::now();
        if stopping() {
            break Ok(());
        }
        if let Mode::Once(limit) = mode {
            if now.duration_since(start) > Duration::from_millis(limit) {
                break Err(if s.is_up() {
                    Error::NotSent(limit)
                } else {
                    Error::NoWelcome(limit)
                });
            }
            if once_sent && s.queued() == 0 && s.output().is_empty() {
                // Give the host a moment to ACK, then say goodbye.
                let t = Instant::now() + Duration::from_millis(300);
                while Instant::now() < t {
                    read_port(&mut port, &mut s, &mut log);
                    std::thread::sleep(Duration::from_millis(20));
                }
                break Ok(());
            }
        }
        let was = port.connected;
        port.check(now, &mut log);
        if was && !port.connected {
            log::info!("host side of the channel closed; waiting for it");
            s.reset();
            next_snapshot = None;
        }
        if port.connected && now >= hello_not_before {
            let stale = s
                .hello_sent_at()
                .is_some_and(|t| now.duration_since(t) >= hello_retry);
            if (!s.is_up() && s.hello_sent_at().is_none()) || stale {
                s.hello(now);
            }
        }
        let mut sync = false;
        if let Some(a) = &mut app {
            sync = a.service();
        }
        let due = next_snapshot.is_some_and(|t| now >= t);
        if s.is_up() && (due || sync || (mode != Mode::Daemon && !once_sent)) {
            epoch += 1;
            let t0 = Instant::now();
            let (hints, reports) = sources.snapshot(app.as_mut());
            let frames = s.queue_snapshot(epoch, &hints);
            let summary: Vec<String> = reports
                .iter()
                .map(|(src, r)| {
                    format!(
                        "{} {} ranges {} KiB",
                        source_name(*src),
                        r.ranges,
                        r.bytes / 1024
                    )
                })
                .collect();
            log::debug!(
                "snapshot {epoch}: {} in {} ms, {frames} frames",
                summary.join(", "),
                t0.elapsed().as_millis()
            );
            for (src, r) in &reports {
                if let Some(e) = &r.error {
                    log.warn(
                        source_name(*src),
                        &format!("source {}: {e}", source_name(*src)),
                    );
                }
            }
            if mode != Mode::Daemon {
                println!("snapshot {epoch}: {}; {frames} frames", summary.join(", "));
                once_sent = true;
            }
            next_snapshot = Some(Instant::now() + interval);
            if let Some(a) = &mut app {
                a.synced(epoch, frames, true);
            }
        } else if sync {
            // No session: answer with the epoch that would have been used.
            if let Some(a) = &mut app {
                a.synced(epoch, 0, false);
            }
        }
        let pump_at = s.pump(Instant::now());
        write_port(&mut port, &mut s, &mut log);
        if now.duration_since(last_status) >= Duration::from_secs(60) {
            last_status = now;
            let st = s.stats;
            log::info!(
                "status: session {}, epoch {epoch}, {} frames / {} ranges sent, host accepted {} rejected {}, {} SLOW_DOWN, {} superseded, {} bad input, {} app clients",
                if s.is_up() { "up" } else { "down" },
                st.frames,
                st.ranges,
                st.accepted,
                st.rejected,
                st.slow_downs,
                st.superseded,
                st.bad_input,
                app.as_ref().map_or(0, |a| a.clients())
            );
        }
        // Sleep until something happens or the next deadline.
        let mut deadline = now + Duration::from_secs(1);
        for t in [
            pump_at,
            next_snapshot,
            s.hello_sent_at().map(|t| t + hello_retry),
        ]
        .into_iter()
        .flatten()
        {
            deadline = deadline.min(t);
        }
        let mut fds: Vec<libc::pollfd> = Vec::new();
        if let (Some(f), true) = (&port.file, port.connected) {
            let mut ev = libc::POLLIN;
            if !s.output().is_empty() {
                ev |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: f.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        if let Some(a) = &app {
            for (fd, out) in a.poll_fds() {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN | if out { libc::POLLOUT } else { 0 },
                    revents: 0,
                });
            }
        }
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .clamp(1, 1000) as libc::c_int;
        // SAFETY: fds is a valid array of fds.len() pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                break Err(Error::Poll(e));
            }
            continue;
        }
        if port.connected && fds.first().is_some_and(|p| p.revents & libc::POLLHUP != 0) {
            port.connected = false;
            log::info!("host side of the channel closed; waiting for it");
            s.reset();
            next_snapshot = None;
            continue;
        }
        for ev in read_port(&mut port, &mut s, &mut log) {
            match ev {
                Event::Welcome(w) => {
                    log::info!(
                        "session up: version {}, {} frames/s, {} bytes/s, {} ranges per frame, frames up to {} bytes",
                        w.version,
                        w.frames_per_s,
                        w.bytes_per_s,
                        w.max_ranges,
                        w.max_frame_bytes
                    );
                    next_snapshot = Some(Instant::now());
                }
                Event::Bye(r) => {
                    log::warn!("host ended the session: BYE {r} ({})", bye_reason(r));
                    let back_off = if r == vmtier_hint_proto::bye::SHUTTING_DOWN { 5 } else { 30 };
                    hello_not_before = Instant::now() + Duration::from_secs(back_off);
                    next_snapshot = None;
                    if mode != Mode::Daemon {
                        break 'main Err(Error::Bye(r));
                    }
                }
                Event::SlowDown {
                    dropped,
                    retry_after_ms,
                } => log.warn(
                    "slow-down",
                    &format!("host dropped {dropped} frames over its rate; pausing {retry_after_ms} ms at half rate"),
                ),
                Event::Bad(what) => log.warn("bad-input", &format!("unusable input from the host: {what}")),
            }
        }
    };
    if port.connected && s.is_up() {
        s.bye(vmtier_hint_proto::bye::NORMAL);
        write_port(&mut port, &mut s, &mut log);
    }
    sources.stop();
    if let Some(a) = &app {
        a.remove();
    }
    let st = s.stats;
    log::info!(
        "stopped: {} frames / {} ranges sent, host accepted {} rejected {}",
        st.frames,
        st.ranges,
        st.accepted,
        st.rejected
    );
    if mode != Mode::Daemon {
        println!(
            "sent {} frames, {} ranges; host accepted {}, rejected {}",
            st.frames, st.ranges, st.accepted, st.rejected
        );
    }
    result
}

fn read_port(port: &mut Port, s: &mut Session, log: &mut RateLog) -> Vec<Event> {
    let mut events = Vec::new();
    let Some(f) = &mut port.file else {
        return events;
    };
    let mut buf = [0u8; 4096];
    loop {
        match f.read(&mut buf) {
            // virtio-serial: no data and the host end closed.
            Ok(0) => break,
            Ok(n) => events.extend(s.receive(&buf[..n], Instant::now())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log.warn(
                    "port-read",
                    &format!("reading the host channel failed: {e}"),
                );
                break;
            }
        }
    }
    events
}

fn write_port(port: &mut Port, s: &mut Session, log: &mut RateLog) {
    let Some(f) = &mut port.file else { return };
    if !port.connected {
        return;
    }
    while !s.output().is_empty() {
        match f.write(s.output()) {
            Ok(0) => break,
            Ok(n) => s.consume_output(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log.warn(
                    "port-write",
                    &format!("writing the host channel failed: {e}"),
                );
                break;
            }
        }
    }
}
