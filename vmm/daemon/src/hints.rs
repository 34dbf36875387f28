//! The guest hint channel (docs/hint-protocol.md, docs/daemon.md).
//!
//! Two halves, both polled by the engine once a tick, never blocking:
//!
//! - [`HintChannel`], the wire side: connects to the VM's chardev socket as a client
//!   (reconnecting with back-off), reads at most [`READ_PER_POLL`] bytes a tick through the
//!   protocol's incremental decoder, answers HELLO with WELCOME, HINTS with ACK, excess with
//!   SLOW_DOWN, and keeps the VM's live hint ranges (at most
//!   [`proto::MAX_LIVE_RANGES`]). Every range is checked alone, including that it lies in the
//!   VM's guest RAM. Frames beyond the token buckets are dropped unread after their header.
//!   Every dropped byte, frame and range is counted by reason ([`HintCounters`]).
//! - [`HintTracker`], the trust side: turns the live ranges into the policy's
//!   [`GuestHint`]s: overlaps resolved, host telemetry cross-checked (a hot claim on a
//!   granule the store shows cold for `distrust_ticks` ticks halves its source's trust; a
//!   consistent source regains trust slowly; a free claim on a granule the host sees hot is
//!   dropped), and hot claims capped to a share of the budget.
//!
//! The guest is untrusted: nothing it sends can grow the host's memory beyond fixed bounds,
//! take more than the read limit per tick, or move the budget (the engine enforces it after
//! the policy, whatever the hints).

use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use log::{info, warn};
use vmtier_core::policy::{Granule, GuestHint, HintKind as PolicyKind};
use vmtier_core::{GuestMemoryLayout, GuestPhysAddr};
use vmtier_hint_proto::{
    self as proto, Ack, Body, DecodeError, Decoder, Frame, Header, HintKind, HintRange, HintSource,
    RangeError, SlowDown, Welcome,
};
use vmtier_sources::store::HotnessStore;

pub use vmtier_api::hints::{
    HintCounters, HintStatus, HintsConfig, SourceTrust, BYTES_PER_S, DISTRUST_TICKS, FRAMES_PER_S,
    MAX_BUDGET_PERCENT,
};

/// Bytes read from the socket per tick at most: [`proto::MAX_BUFFERED_FRAMES`] maximal
/// frames (256 KiB). What the guest sends beyond waits in the socket (and then in QEMU),
/// so a flood costs the host a bounded amount of work per tick.
pub const READ_PER_POLL: usize = proto::MAX_BUFFERED_FRAMES * proto::MAX_FRAME_BYTES;
/// Replies waiting to be written at most, bytes; beyond, replies are dropped (counted). A
/// guest that never reads its port cannot make the host buffer more.
pub const MAX_PENDING_REPLY_BYTES: usize = 4096;
/// First reconnect delay; doubles per failure up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest reconnect delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// HINTS before a connection's first HELLO or BYE are excused this long after vmtierd
/// connects: the tail of a batch whose HELLO went out before, until the guest sees the host
/// open its port and says HELLO (the vmtier agent at once, retrying every 2 s; the workload
/// guest before every batch). A guest sending HINTS without a HELLO after it is flagged.
pub const AT_CONNECT_GRACE: Duration = Duration::from_secs(10);
/// A VM stays flagged misbehaving this long after its last protocol violation.
pub const MISBEHAVING_FOR: Duration = Duration::from_secs(60);
/// Full trust in a source (trust is in 1/256ths).
pub const FULL_TRUST: u16 = 256;
/// Trust a consistent source regains per tick (full trust back from nothing in 16 ticks).
pub const TRUST_RECOVERY: u16 = 16;
/// Host heat at or above which a granule counts as hot when checking a cold or free claim.
pub const CONTRADICT_HEAT: u8 = 4;

/// Token bucket in micro-tokens, refilled at every read of the socket (once a tick). It
/// holds one second of rate (at least `min_burst`) or, when reads are further apart than
/// that (a tick that ran long), what the rate allowed since the previous read: a guest that
/// kept to its rate is not refused for the daemon's own delay, and the excess lasts only
/// until the next read.
#[derive(Clone, Copy, Debug)]
struct TokenBucket {
    rate: u64,
    cap_micro: u128,
    micro: u128,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: u64, min_burst: u64, now: Instant) -> Self {
        let cap = u128::from(rate.max(min_burst)) * 1_000_000;
        Self {
            rate,
            cap_micro: cap,
            micro: cap,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let us = now.saturating_duration_since(self.last).as_micros();
        if us == 0 {
            return;
        }
        self.last = now;
        let add = us.saturating_mul(u128::from(self.rate));
        self.micro = self.micro.saturating_add(add).min(self.cap_micro.max(add));
    }

    fn has(&self, n: u64) -> bool {
        self.micro >= u128::from(n) * 1_000_000
    }

    fn take(&mut self, n: u64) {
        self.micro = self.micro.saturating_sub(u128::from(n) * 1_000_000);
    }
}

/// A VM's hint parts, built from `[vm.hints]` by the daemon (or by tests with a fake feed).
pub struct HintParts {
    /// Where the hints come from.
    pub feed: Box<dyn HintFeed>,
    /// `distrust_ticks`.
    pub distrust_ticks: u32,
    /// `max_budget_percent`.
    pub max_budget_percent: u8,
}

impl std::fmt::Debug for HintParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HintParts")
            .field("distrust_ticks", &self.distrust_ticks)
            .field("max_budget_percent", &self.max_budget_percent)
            .finish_non_exhaustive()
    }
}

impl HintParts {
    /// The real channel for `cfg`, or `None` if it is disabled.
    pub fn from_config(vm: &str, cfg: &HintsConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            feed: Box::new(HintChannel::new(vm, cfg.clone(), Instant::now())),
            distrust_ticks: cfg.distrust_ticks,
            max_budget_percent: cfg.max_budget_percent,
        })
    }
}

/// A validated range the guest currently claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRange {
    /// The range.
    pub range: HintRange,
}

/// What the engine reads from a VM's hints each tick. [`HintChannel`] is the real one; the
/// engine's tests use fakes.
pub trait HintFeed: Send {
    /// Does this tick's I/O and returns the live ranges, all inside `layout`'s RAM.
    fn poll(&mut self, layout: &GuestMemoryLayout, now: Instant) -> &[LiveRange];
    /// Counters and connection state.
    fn status(&self) -> HintStatus;
    /// Protocol violations since the last call, described for the log, if any.
    fn take_violations(&mut self) -> Option<String>;
}

/// Connection state.
#[derive(Debug)]
enum Conn {
    Down { retry_at: Instant, failures: u32 },
    Up(UnixStream),
}

/// Session state of a connection.
#[derive(Clone, Copy, Debug, Default)]
struct Session {
    version: Option<u16>,
    last_seq: u32,
    last_epoch: u64,
}

/// The wire side of one VM's hints.
#[derive(Debug)]
pub struct HintChannel {
    cfg: HintsConfig,
    vm: String,
    conn: Conn,
    decoder: Decoder,
    session: Session,
    agent: String,
    frames: TokenBucket,
    bytes: TokenBucket,
    out: Vec<u8>,
    live: VecDeque<LiveRange>,
    counters: HintCounters,
    reported: HintCounters,
    dropped_since_notice: u32,
    last_notice: Option<Instant>,
    last_error: Option<String>,
    last_error_log: Option<Instant>,
    read_buf: Box<[u8]>,
    /// How far into the guest's stream this connection has seen, and since when it is up.
    joined: Joined,
    connected_at: Instant,
}

/// How far into the guest's frame stream a connection has seen. vmtierd may connect in the
/// middle of it: what comes before the first frame, and HINTS before the first HELLO or BYE,
/// are the tail of what the guest sent before, not violations (counted apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Joined {
    /// No frame yet: bytes are the tail of a frame sent before vmtierd connected.
    Bytes,
    /// A frame (good or bad), but no HELLO or BYE: HINTS are the tail of a batch whose HELLO
    /// went out before vmtierd connected, for [`AT_CONNECT_GRACE`].
    Frames,
    /// A HELLO or BYE: every frame counts.
    Session,
}

impl HintChannel {
    /// A channel for VM `vm`; it connects on its first poll.
    pub fn new(vm: &str, cfg: HintsConfig, now: Instant) -> Self {
        let frames = TokenBucket::new(cfg.frames_per_s.into(), 1, now);
        let bytes = TokenBucket::new(cfg.bytes_per_s.0, proto::MAX_FRAME_BYTES as u64, now);
        Self {
            cfg,
            vm: vm.into(),
            conn: Conn::Down {
                retry_at: now,
                failures: 0,
            },
            decoder: Decoder::new(),
            session: Session::default(),
            agent: String::new(),
            frames,
            bytes,
            out: Vec::with_capacity(MAX_PENDING_REPLY_BYTES),
            live: VecDeque::new(),
            counters: HintCounters::default(),
            reported: HintCounters::default(),
            dropped_since_notice: 0,
            last_notice: None,
            last_error: None,
            last_error_log: None,
            read_buf: vec![0u8; 16 << 10].into_boxed_slice(),
            joined: Joined::Bytes,
            connected_at: now,
        }
    }

    fn connect(&mut self, now: Instant) {
        let Conn::Down { retry_at, failures } = self.conn else {
            return;
        };
        if now < retry_at {
            return;
        }
        let res = UnixStream::connect(&self.cfg.socket).and_then(|s| {
            s.set_nonblocking(true)?;
            Ok(s)
        });
        match res {
            Ok(s) => {
                info!(
                    "{}: hints: connected to {}",
                    self.vm,
                    self.cfg.socket.display()
                );
                self.counters.connects += 1;
                self.last_error = None;
                self.conn = Conn::Up(s);
                self.joined = Joined::Bytes;
                self.connected_at = now;
            }
            Err(e) => {
                self.counters.connect_errors += 1;
                let why = format!("cannot connect to {}: {e}", self.cfg.socket.display());
                self.down(now, failures.saturating_add(1), why);
            }
        }
    }

    /// Closes the connection (if any) and schedules a reconnect; the session and the live
    /// hints go with it.
    fn down(&mut self, now: Instant, failures: u32, why: String) {
        let delay = MIN_BACKOFF
            .saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX))
            .min(MAX_BACKOFF);
        if self.last_error_log.map_or(true, |at| {
            now.saturating_duration_since(at) >= MISBEHAVING_FOR
        }) {
            warn!(
                "{}: hints: {why}; retrying in {} ms",
                self.vm,
                delay.as_millis()
            );
            self.last_error_log = Some(now);
        }
        self.last_error = Some(why);
        self.conn = Conn::Down {
            retry_at: now + delay,
            failures,
        };
        self.decoder.reset();
        self.session = Session::default();
        self.out.clear();
        self.live.clear();
    }

    fn reply(&mut self, body: Body) {
        let f = Frame::new(0, body);
        if self.out.len().saturating_add(f.encoded_len()) > MAX_PENDING_REPLY_BYTES {
            self.counters.replies_dropped += 1;
            return;
        }
        if f.encode(&mut self.out).is_err() {
            self.counters.replies_dropped += 1;
        }
    }

    fn flush(&mut self, now: Instant) {
        let Conn::Up(s) = &mut self.conn else {
            return;
        };
        while !self.out.is_empty() {
            match s.write(&self.out) {
                Ok(0) => break,
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.down(now, 0, format!("write failed: {e}"));
                    break;
                }
            }
        }
    }

    /// Reads and decodes up to [`READ_PER_POLL`] bytes.
    fn read(&mut self, layout: &GuestMemoryLayout, now: Instant) {
        // Every poll, data or not, so that a refill covers one poll interval at most.
        self.frames.refill(now);
        self.bytes.refill(now);
        let mut budget = READ_PER_POLL;
        let mut buf = std::mem::take(&mut self.read_buf);
        while budget > 0 {
            let Conn::Up(s) = &mut self.conn else {
                break;
            };
            let want = budget.min(buf.len());
            let n = match s.read(&mut buf[..want]) {
                Ok(0) => {
                    self.down(now, 0, "the VM closed the hint socket".into());
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.down(now, 0, format!("read failed: {e}"));
                    break;
                }
            };
            budget -= n;
            self.ingest(&buf[..n], layout, now);
        }
        self.read_buf = buf;
    }

    /// Decodes and acts on `bytes` from the guest, as if read from the socket at `now`
    /// (the `hints` fuzz target calls it directly).
    pub fn ingest(&mut self, bytes: &[u8], layout: &GuestMemoryLayout, now: Instant) {
        self.counters.bytes_read += bytes.len() as u64;
        self.frames.refill(now);
        self.bytes.refill(now);
        let mut off = 0;
        while off < bytes.len() {
            off += self.decoder.feed(&bytes[off..]);
            self.drain(layout, now);
        }
    }

    /// The live ranges (as [`HintFeed::poll`] returns them, without I/O).
    pub fn live(&mut self) -> &[LiveRange] {
        self.live.make_contiguous()
    }

    /// Bytes of replies waiting to be written.
    pub fn pending_reply_bytes(&self) -> usize {
        self.out.len()
    }

    /// Bytes the decoder holds.
    pub fn buffered_bytes(&self) -> usize {
        self.decoder.buffered()
    }

    /// Decodes every complete frame buffered.
    fn drain(&mut self, layout: &GuestMemoryLayout, now: Instant) {
        loop {
            let (frames, bytes) = (&mut self.frames, &mut self.bytes);
            let next = self.decoder.next_frame(|h: &Header| {
                let size = h.frame_bytes();
                if frames.has(1) && bytes.has(size) {
                    frames.take(1);
                    bytes.take(size);
                    true
                } else {
                    false
                }
            });
            match next {
                None => return,
                Some(Ok(f)) => {
                    self.joined = self.joined.max(Joined::Frames);
                    self.frame(f, layout, now);
                }
                Some(Err(e)) => {
                    if !matches!(e, DecodeError::Garbage { .. }) {
                        self.joined = self.joined.max(Joined::Frames);
                    }
                    self.dropped(e, now);
                }
            }
        }
    }

    fn dropped(&mut self, e: DecodeError, now: Instant) {
        let c = &mut self.counters;
        match e {
            DecodeError::Garbage { bytes } => {
                c.garbage_bytes += bytes as u64;
                if self.joined == Joined::Bytes {
                    c.resync_bytes += bytes as u64;
                }
            }
            DecodeError::Oversize { .. } => c.dropped_oversize += 1,
            DecodeError::BadVersion { .. } => c.dropped_bad_version += 1,
            DecodeError::UnknownType { .. } => c.dropped_bad_type += 1,
            DecodeError::BadLength { .. } | DecodeError::BadField { .. } => {
                c.dropped_bad_length += 1;
            }
            DecodeError::Refused { .. } => {
                c.dropped_rate += 1;
                self.dropped_since_notice = self.dropped_since_notice.saturating_add(1);
                let due = self.last_notice.map_or(true, |at| {
                    now.saturating_duration_since(at)
                        >= Duration::from_millis(proto::SLOW_DOWN_INTERVAL_MS.into())
                });
                if due {
                    self.reply(Body::SlowDown(SlowDown {
                        dropped: self.dropped_since_notice,
                        retry_after_ms: proto::SLOW_DOWN_INTERVAL_MS,
                    }));
                    self.counters.slow_downs_sent += 1;
                    self.dropped_since_notice = 0;
                    self.last_notice = Some(now);
                }
            }
        }
    }

    fn frame(&mut self, f: Frame, layout: &GuestMemoryLayout, now: Instant) {
        match f.body {
            Body::Hello(h) => {
                self.joined = Joined::Session;
                self.agent = h.name_lossy();
                match h.negotiate(proto::HOST_MIN_VERSION, proto::HOST_MAX_VERSION) {
                    Some(v) => {
                        self.counters.frames_ok += 1;
                        self.session = Session {
                            version: Some(v),
                            last_seq: 0,
                            last_epoch: 0,
                        };
                        self.reply(Body::Welcome(Welcome {
                            version: v,
                            max_frame_bytes: u32::try_from(proto::MAX_FRAME_BYTES)
                                .unwrap_or(u32::MAX),
                            max_ranges: u32::try_from(proto::MAX_RANGES_PER_FRAME)
                                .unwrap_or(u32::MAX),
                            frames_per_s: self.cfg.frames_per_s,
                            bytes_per_s: u32::try_from(self.cfg.bytes_per_s.0).unwrap_or(u32::MAX),
                        }));
                    }
                    None => {
                        self.counters.dropped_bad_version += 1;
                        self.session = Session::default();
                        self.reply(Body::Bye(proto::Bye {
                            reason: proto::bye::VERSION_UNSUPPORTED,
                        }));
                    }
                }
            }
            Body::Hints(h) => {
                let Some(version) = self.session.version else {
                    self.counters.dropped_before_hello += 1;
                    let young = now.saturating_duration_since(self.connected_at) < AT_CONNECT_GRACE;
                    if self.joined < Joined::Session && young {
                        self.counters.resync_before_hello += 1;
                    }
                    return;
                };
                if f.version != version {
                    self.counters.dropped_bad_version += 1;
                    return;
                }
                if f.seq <= self.session.last_seq || h.epoch < self.session.last_epoch {
                    self.counters.dropped_replay += 1;
                    return;
                }
                self.session.last_seq = f.seq;
                self.session.last_epoch = h.epoch;
                self.counters.frames_ok += 1;
                let (accepted, rejected) = self.hints(&h, layout);
                self.reply(Body::Ack(Ack {
                    acked_seq: f.seq,
                    accepted,
                    rejected,
                }));
            }
            Body::Bye(_) => {
                self.joined = Joined::Session;
                self.counters.frames_ok += 1;
                self.session = Session::default();
            }
            // Only the host sends these.
            Body::Welcome(_) | Body::Ack(_) | Body::SlowDown(_) => {
                self.counters.dropped_bad_type += 1;
            }
        }
    }

    /// Checks and keeps the ranges of one HINTS frame; returns (accepted, rejected).
    fn hints(&mut self, h: &proto::Hints, layout: &GuestMemoryLayout) -> (u32, u32) {
        let mut good = Vec::with_capacity(h.ranges.len());
        let mut replace = [false; HintSource::COUNT];
        let mut rejected = 0u32;
        for raw in &h.ranges {
            if let Some(s) = HintSource::from_u8(raw.source) {
                replace[s.index()] = true;
            }
            match raw.check() {
                Ok(r) if in_ram(layout, &r) => good.push(LiveRange { range: r }),
                Ok(_) => {
                    self.counters.ranges_rejected_outside_ram += 1;
                    rejected += 1;
                }
                Err(RangeError::Unaligned | RangeError::Empty | RangeError::Overflow)
                | Err(
                    RangeError::BadKind(_)
                    | RangeError::BadWeight
                    | RangeError::BadSource(_)
                    | RangeError::Reserved,
                ) => {
                    self.counters.ranges_rejected_invalid += 1;
                    rejected += 1;
                }
            }
        }
        if h.flags & proto::FLAG_REPLACE != 0 {
            self.live.retain(|l| !replace[l.range.source.index()]);
        }
        let accepted = u32::try_from(good.len()).unwrap_or(u32::MAX);
        self.counters.ranges_accepted += u64::from(accepted);
        for l in good {
            if self.live.len() >= proto::MAX_LIVE_RANGES {
                self.live.pop_front();
                self.counters.evicted_ranges += 1;
            }
            self.live.push_back(l);
        }
        (accepted, rejected)
    }
}

/// Whether the range lies inside one of the VM's RAM ranges.
fn in_ram(layout: &GuestMemoryLayout, r: &HintRange) -> bool {
    layout.ranges.iter().any(|m| {
        let start = m.gpa.0;
        start <= r.gpa && m.gpa_end().is_some_and(|end| r.end() <= end.0)
    })
}

impl HintFeed for HintChannel {
    fn poll(&mut self, layout: &GuestMemoryLayout, now: Instant) -> &[LiveRange] {
        if self.cfg.enabled {
            self.connect(now);
            self.read(layout, now);
            self.flush(now);
        }
        self.live()
    }

    fn status(&self) -> HintStatus {
        HintStatus {
            socket: self.cfg.socket.clone(),
            connected: matches!(self.conn, Conn::Up(_)),
            agent: self.agent.clone(),
            version: self.session.version.unwrap_or(0),
            live_ranges: self.live.len() as u64,
            last_error: self.last_error.clone(),
            counters: self.counters,
            ..HintStatus::default()
        }
    }

    fn take_violations(&mut self) -> Option<String> {
        let (c, r) = (&self.counters, &self.reported);
        let parts: Vec<String> = [
            (
                "garbage bytes",
                (c.garbage_bytes - c.resync_bytes) - (r.garbage_bytes - r.resync_bytes),
            ),
            ("replayed", c.dropped_replay - r.dropped_replay),
            (
                "before HELLO",
                (c.dropped_before_hello - c.resync_before_hello)
                    - (r.dropped_before_hello - r.resync_before_hello),
            ),
            ("bad version", c.dropped_bad_version - r.dropped_bad_version),
            ("oversize", c.dropped_oversize - r.dropped_oversize),
            ("bad type", c.dropped_bad_type - r.dropped_bad_type),
            ("bad length", c.dropped_bad_length - r.dropped_bad_length),
            (
                "invalid ranges",
                c.ranges_rejected_invalid - r.ranges_rejected_invalid,
            ),
            (
                "ranges outside RAM",
                c.ranges_rejected_outside_ram - r.ranges_rejected_outside_ram,
            ),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect();
        self.reported = self.counters;
        (!parts.is_empty())
            .then(|| format!("the guest broke the hint protocol: {}", parts.join(", ")))
    }
}

/// A run of granules one claim covers after overlaps are resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    start: u32,
    end: u32,
    kind: HintKind,
    weight: u8,
    source: HintSource,
}

/// Priority when claims overlap: pinned, hot, cold, free (a hot claim over a free one means
/// the free one is stale).
fn priority(k: HintKind) -> u8 {
    match k {
        HintKind::Pinned => 3,
        HintKind::Hot => 2,
        HintKind::Cold => 1,
        HintKind::Free => 0,
    }
}

/// The trust side: live ranges → the policy's hints, per tick.
#[derive(Debug)]
pub struct HintTracker {
    distrust_ticks: u32,
    max_budget_percent: u8,
    trust: [u16; HintSource::COUNT],
    seen: [bool; HintSource::COUNT],
    streak: Vec<u16>,
    next_streak: Vec<u16>,
    out: Vec<GuestHint>,
    /// Granules handed to the policy last tick.
    pub hinted_granules: u64,
    /// Contradicted granule-ticks, trust halvings, capped granule-ticks (summed).
    pub contradicted: u64,
    /// See `contradicted`.
    pub halvings: u64,
    /// See `contradicted`.
    pub capped: u64,
}

impl HintTracker {
    /// A tracker with full trust in every source.
    pub fn new(distrust_ticks: u32, max_budget_percent: u8) -> Self {
        Self {
            distrust_ticks: distrust_ticks.max(1),
            max_budget_percent: max_budget_percent.min(100),
            trust: [FULL_TRUST; HintSource::COUNT],
            seen: [false; HintSource::COUNT],
            streak: Vec::new(),
            next_streak: Vec::new(),
            out: Vec::new(),
            hinted_granules: 0,
            contradicted: 0,
            halvings: 0,
            capped: 0,
        }
    }

    /// Trust in `source`, 0..=256.
    pub fn trust(&self, source: HintSource) -> u16 {
        self.trust[source.index()]
    }

    /// Trust per source that has sent hints, for status.
    pub fn trust_status(&self) -> Vec<SourceTrust> {
        const NAMES: [&str; HintSource::COUNT] =
            ["app", "process", "free-pages", "guest-damon", "pmu"];
        (0..HintSource::COUNT)
            .filter(|&i| self.seen[i])
            .map(|i| SourceTrust {
                source: NAMES[i].into(),
                percent: u32::from(self.trust[i]) * 100 / u32::from(FULL_TRUST),
            })
            .collect()
    }

    /// One tick: resolves `live` against the store's granules and records, updates trust,
    /// and returns the hints for the policy (sorted, not overlapping). `budget` in granules.
    pub fn step(&mut self, live: &[LiveRange], store: &HotnessStore, budget: u64) -> &[GuestHint] {
        let records = store.records();
        let pieces = resolve(live, store);
        // Cross-check with the host's telemetry; streaks of contradiction per granule.
        self.next_streak.clear();
        self.next_streak.resize(records.len(), 0);
        if self.streak.len() != records.len() {
            self.streak.clear();
            self.streak.resize(records.len(), 0);
        }
        let mut halve = [false; HintSource::COUNT];
        let mut confirmed = [false; HintSource::COUNT];
        let mut contradicted = [false; HintSource::COUNT];
        let mut kept: Vec<Piece> = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let s = p.source.index();
            self.seen[s] = true;
            let mut run: Option<Piece> = None;
            for g in p.start..p.end {
                let i = g as usize;
                let heat = records.get(i).map_or(0, |r| r.heat());
                let against = match p.kind {
                    HintKind::Hot | HintKind::Pinned => heat == 0,
                    HintKind::Cold | HintKind::Free => heat >= CONTRADICT_HEAT,
                };
                if against {
                    contradicted[s] = true;
                    self.contradicted += 1;
                    let n = self.streak.get(i).copied().unwrap_or(0).saturating_add(1);
                    if u32::from(n) >= self.distrust_ticks {
                        halve[s] = true;
                    } else if let Some(x) = self.next_streak.get_mut(i) {
                        *x = n;
                    }
                } else {
                    confirmed[s] = true;
                }
                // The host wins over a free or cold claim on a granule it sees hot.
                let keep = !(against && matches!(p.kind, HintKind::Free | HintKind::Cold));
                match (&mut run, keep) {
                    (Some(r), true) => r.end = g + 1,
                    (None, true) => {
                        run = Some(Piece {
                            start: g,
                            end: g + 1,
                            ..*p
                        });
                    }
                    (Some(_), false) => kept.extend(run.take()),
                    (None, false) => {}
                }
            }
            kept.extend(run);
        }
        std::mem::swap(&mut self.streak, &mut self.next_streak);
        for s in 0..HintSource::COUNT {
            if halve[s] {
                self.trust[s] /= 2;
                self.halvings += 1;
            } else if confirmed[s] && !contradicted[s] {
                self.trust[s] = self.trust[s].saturating_add(TRUST_RECOVERY).min(FULL_TRUST);
            }
        }
        // Hot claims, strongest first, up to the budget share.
        let cap = budget.saturating_mul(u64::from(self.max_budget_percent)) / 100;
        let mut hot: Vec<usize> = (0..kept.len())
            .filter(|&i| matches!(kept[i].kind, HintKind::Hot | HintKind::Pinned))
            .collect();
        hot.sort_by_key(|&i| {
            let p = &kept[i];
            (
                std::cmp::Reverse(priority(p.kind)),
                std::cmp::Reverse(self.weight(p)),
                p.start,
            )
        });
        let mut left = cap;
        for i in hot {
            let p = &mut kept[i];
            let len = u64::from(p.end - p.start);
            let take = len.min(left);
            left -= take;
            self.capped += len - take;
            // take <= len, which fits u32.
            p.end = p.start + u32::try_from(take).unwrap_or(0);
        }
        self.out.clear();
        self.hinted_granules = 0;
        for p in &kept {
            let weight = self.weight(p);
            if p.end <= p.start || weight == 0 {
                continue;
            }
            self.hinted_granules += u64::from(p.end - p.start);
            self.out.push(GuestHint {
                start: Granule(p.start),
                len: p.end - p.start,
                kind: match p.kind {
                    HintKind::Hot => PolicyKind::Hot,
                    HintKind::Cold => PolicyKind::Cold,
                    HintKind::Free => PolicyKind::Free,
                    HintKind::Pinned => PolicyKind::Pinned,
                },
                weight,
            });
        }
        self.out.sort_by_key(|h| h.start);
        &self.out
    }

    /// The hints of the last [`Self::step`].
    pub fn hints(&self) -> &[GuestHint] {
        &self.out
    }

    /// A piece's guest weight scaled by its source's trust.
    fn weight(&self, p: &Piece) -> u8 {
        let w =
            u32::from(p.weight) * u32::from(self.trust[p.source.index()]) / u32::from(FULL_TRUST);
        u8::try_from(w).unwrap_or(u8::MAX)
    }
}

/// Granule runs of the live ranges, overlaps resolved by priority then weight (the first
/// claim of equal rank wins). A hot or pinned claim covers every granule it touches; a cold
/// or free one only granules it covers whole (a granule moves whole). O(n log n) in ranges.
fn resolve(live: &[LiveRange], store: &HotnessStore) -> Vec<Piece> {
    let mut claims: Vec<Piece> = live
        .iter()
        .filter_map(|l| {
            let r = l.range;
            let first = store.granule_of_gpa(GuestPhysAddr(r.gpa))?;
            let last = store.granule_of_gpa(GuestPhysAddr(r.end().checked_sub(1)?))?;
            let (mut start, mut end) = (first.0, last.0.checked_add(1)?);
            if matches!(r.kind, HintKind::Cold | HintKind::Free) {
                if store.span(first)?.gpa.0 < r.gpa {
                    start += 1;
                }
                let tail = store.span(last)?;
                if tail.gpa.0.checked_add(tail.len)? > r.end() {
                    end -= 1;
                }
            }
            (start < end).then_some(Piece {
                start,
                end,
                kind: r.kind,
                weight: r.weight,
                source: r.source,
            })
        })
        .collect();
    claims.sort_by_key(|p| {
        (
            std::cmp::Reverse(priority(p.kind)),
            std::cmp::Reverse(p.weight),
        )
    });
    // Claimed runs: start -> end, not overlapping.
    let mut taken: BTreeMap<u32, u32> = BTreeMap::new();
    let mut out = Vec::with_capacity(claims.len());
    for c in claims {
        let mut at = c.start;
        // The run that starts before `at` may cover it.
        if let Some((_, &e)) = taken.range(..=at).next_back() {
            at = at.max(e);
        }
        let mut pieces = Vec::new();
        while at < c.end {
            let next = taken.range(at..c.end).next().map(|(&s, &e)| (s, e));
            match next {
                Some((s, e)) => {
                    if s > at {
                        pieces.push((at, s));
                    }
                    at = e;
                }
                None => {
                    pieces.push((at, c.end));
                    at = c.end;
                }
            }
        }
        for (s, e) in pieces {
            taken.insert(s, e);
            out.push(Piece {
                start: s,
                end: e,
                ..c
            });
        }
    }
    out.sort_by_key(|p| p.start);
    out
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation, // small test constants
    clippy::needless_pass_by_value,
    clippy::type_complexity // test tables
)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use vmtier_core::policy::HintKind as PK;
    use vmtier_core::{Backing, GuestRamRange, HostVirtAddr, ProcessId, RegionAccess};
    use vmtier_hint_proto::{Hello, Hints, RawRange};
    use vmtier_sources::store::StoreConfig;

    const MIB: u64 = 1 << 20;
    const HVA: u64 = 0x7f00_0000_0000;

    /// 64 MiB of RAM at GPA 0 and 64 MiB at GPA 4 GiB (a hole between, as on x86).
    fn layout() -> GuestMemoryLayout {
        let r = |name: &str, gpa: u64, hva: u64| GuestRamRange {
            name: name.into(),
            gpa: GuestPhysAddr(gpa),
            hva: HostVirtAddr::new(hva),
            len: 64 * MIB,
            backing: Backing::PrivateAnon,
        };
        GuestMemoryLayout::new(
            ProcessId::new(1),
            vec![r("low", 0, HVA), r("high", 4 << 30, HVA + 64 * MIB)],
        )
        .unwrap()
    }

    #[test]
    fn config_defaults_and_bounds() {
        let vm = |extra: &str| {
            format!(
                "[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/q\"\n[vm.hints]\nsocket = \"/run/a.hints\"\n{extra}"
            )
        };
        let cfg = crate::config::Config::parse(&vm("")).unwrap();
        assert_eq!(
            cfg.vms[0].hints,
            Some(HintsConfig::new("/run/a.hints".into()))
        );
        let h = HintsConfig::new("/x".into());
        assert_eq!(
            (
                h.enabled,
                h.frames_per_s,
                h.bytes_per_s.0,
                h.distrust_ticks,
                h.max_budget_percent
            ),
            (true, 20, 256 << 10, 5, 50)
        );
        let cases = [
            (
                "frames_per_s = 0",
                "hints frames_per_s 0 is out of range: 1 to 1000",
            ),
            ("frames_per_s = 1001", "out of range"),
            (
                "bytes_per_s = \"32K\"",
                "hints bytes_per_s 32768 is out of range: 65536 bytes to 16777216 bytes",
            ),
            ("bytes_per_s = \"17M\"", "out of range"),
            ("distrust_ticks = 0", "hints distrust_ticks 0"),
            (
                "max_budget_percent = 101",
                "hints max_budget_percent 101 is out of range: 0 % to 100 %",
            ),
            ("max_budget_percent = 300", "line 7"),
            ("sockett = \"/x\"", "unknown field `sockett`"),
        ];
        for (line, want) in cases {
            let err = crate::config::Config::parse(&vm(line))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
        let err = crate::config::Config::parse(
            "[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/q\"\n[vm.hints]\nenabled = true\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("missing field `socket`"), "{err}");
        for (line, ok) in [
            ("frames_per_s = 1000", true),
            ("bytes_per_s = \"16M\"", true),
            ("max_budget_percent = 0", true),
            ("enabled = false", true),
        ] {
            assert_eq!(
                crate::config::Config::parse(&vm(line)).is_ok(),
                ok,
                "{line}"
            );
        }
    }

    /// A guest end: QEMU's chardev socket stands in as a listener the channel connects to.
    struct Guest {
        _dir: PathBuf,
        listener: UnixListener,
        conn: Option<UnixStream>,
    }

    fn guest(name: &str) -> (Guest, HintChannel) {
        guest_with(name, |_| {})
    }

    fn guest_with(name: &str, f: impl FnOnce(&mut HintsConfig)) -> (Guest, HintChannel) {
        let dir = std::env::temp_dir().join(format!("vmtier-hints-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("h.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let mut cfg = HintsConfig::new(sock);
        f(&mut cfg);
        let ch = HintChannel::new(name, cfg, Instant::now());
        (
            Guest {
                _dir: dir,
                listener,
                conn: None,
            },
            ch,
        )
    }

    impl Guest {
        fn send(&mut self, bytes: &[u8]) {
            if self.conn.is_none() {
                let (s, _) = self.listener.accept().unwrap();
                self.conn = Some(s);
            }
            self.conn.as_mut().unwrap().write_all(bytes).unwrap();
        }
        /// Every frame the host sent so far.
        fn replies(&mut self) -> Vec<Body> {
            let s = self.conn.as_mut().unwrap();
            s.set_nonblocking(true).unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut d = Decoder::new();
            let mut out = Vec::new();
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut off = 0;
                while off < n {
                    off += d.feed(&buf[off..n]);
                    while let Some(r) = d.next_frame(|_| true) {
                        out.push(r.unwrap().body);
                    }
                }
            }
            out
        }
    }

    fn enc(f: Frame) -> Vec<u8> {
        let mut v = Vec::new();
        f.encode(&mut v).unwrap();
        v
    }

    fn hello() -> Vec<u8> {
        enc(Frame::new(0, Body::Hello(Hello::new(1, 1, "test-agent"))))
    }

    fn raw(gpa: u64, len: u64, kind: u8) -> RawRange {
        RawRange {
            gpa,
            len,
            kind,
            weight: 100,
            source: 2,
            reserved: [0; 5],
        }
    }

    fn hints(seq: u32, epoch: u64, ranges: Vec<RawRange>) -> Vec<u8> {
        enc(Frame::new(
            seq,
            Body::Hints(Hints {
                epoch,
                flags: proto::FLAG_REPLACE,
                ranges,
            }),
        ))
    }

    /// Connects (first poll), sends `bytes`, polls again; returns the channel's counters.
    fn exchange(g: &mut Guest, ch: &mut HintChannel, bytes: &[u8]) -> HintCounters {
        let l = layout();
        let now = Instant::now();
        ch.poll(&l, now);
        g.send(bytes);
        ch.poll(&l, now);
        ch.status().counters
    }

    #[test]
    fn a_well_behaved_session() {
        let (mut g, mut ch) = guest("good");
        let bytes = [
            hello(),
            hints(1, 1, vec![raw(0, 2 * MIB, 1), raw(4 << 30, 4096, 3)]),
            hints(2, 1, vec![raw(8 * MIB, 4096, 4)]),
        ]
        .concat();
        let c = exchange(&mut g, &mut ch, &bytes);
        assert_eq!((c.frames_ok, c.ranges_accepted, c.connects), (3, 3, 1));
        // REPLACE: the second batch of the same source replaced the first.
        let l = layout();
        assert_eq!(ch.poll(&l, Instant::now()).len(), 1);
        let st = ch.status();
        assert!(st.connected);
        assert_eq!((st.agent.as_str(), st.version), ("test-agent", 1));
        assert!(ch.take_violations().is_none());
        let replies = g.replies();
        assert!(
            matches!(replies[0], Body::Welcome(w) if w.version == 1 && w.frames_per_s == 20 && w.bytes_per_s == 256 << 10),
            "{replies:?}"
        );
        assert_eq!(
            replies[1..],
            [
                Body::Ack(Ack {
                    acked_seq: 1,
                    accepted: 2,
                    rejected: 0
                }),
                Body::Ack(Ack {
                    acked_seq: 2,
                    accepted: 1,
                    rejected: 0
                })
            ]
        );
    }

    #[test]
    fn every_bad_frame_class_is_counted() {
        let mut bad_magic = hello();
        bad_magic[0] = b'X';
        let mut hints_v2 = hints(5, 1, vec![raw(0, 4096, 1)]);
        hints_v2[4] = 2;
        let mut oversize = hints(5, 1, vec![raw(0, 4096, 1)]);
        oversize[12..16].copy_from_slice(&70_000u32.to_le_bytes());
        let mut bad_type = hints(5, 1, vec![raw(0, 4096, 1)]);
        bad_type[6] = 9;
        let mut bad_len = hello();
        bad_len[12] = 39;
        let welcome = enc(Frame::new(
            3,
            Body::Welcome(Welcome {
                version: 1,
                max_frame_bytes: 1,
                max_ranges: 1,
                frames_per_s: 1,
                bytes_per_s: 1,
            }),
        ));
        type Check = fn(&HintCounters) -> bool;
        // (name, bytes after a HELLO (or instead of one), check)
        let cases: Vec<(&str, Vec<u8>, Check)> = vec![
            // vmtierd connected after the guest's HELLO: dropped, but no violation.
            ("before hello", hints(1, 1, vec![raw(0, 4096, 1)]), |c| {
                c.dropped_before_hello == 1 && c.resync_before_hello == 1 && c.ranges_accepted == 0
            }),
            (
                "before hello, then a session",
                [
                    hints(7, 1, vec![raw(0, 4096, 1)]),
                    hello(),
                    hints(1, 1, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.resync_before_hello == 1 && c.frames_ok == 2 && c.ranges_accepted == 1,
            ),
            (
                "before hello after a bye",
                [
                    enc(Frame::new(1, Body::Bye(proto::Bye { reason: 0 }))),
                    hints(2, 1, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.dropped_before_hello == 1 && c.resync_before_hello == 0,
            ),
            (
                "garbage",
                [b"\x00\xffgarbage".to_vec(), hello()].concat(),
                |c| c.garbage_bytes == 9 && c.resync_bytes == 9 && c.frames_ok == 1,
            ),
            (
                "garbage mid-session",
                [hello(), b"\x00\xffgarbage".to_vec(), hello()].concat(),
                |c| c.garbage_bytes == 9 && c.resync_bytes == 0 && c.frames_ok == 2,
            ),
            ("bad magic", [bad_magic, hello()].concat(), |c| {
                c.garbage_bytes == 56 && c.frames_ok == 1
            }),
            (
                "replay",
                [
                    hello(),
                    hints(3, 1, vec![raw(0, 4096, 1)]),
                    hints(3, 1, vec![raw(0, 4096, 1)]),
                    hints(2, 1, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.dropped_replay == 2 && c.frames_ok == 2,
            ),
            (
                "epoch going back",
                [
                    hello(),
                    hints(3, 9, vec![raw(0, 4096, 1)]),
                    hints(4, 8, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.dropped_replay == 1,
            ),
            (
                "hello resets seq",
                [
                    hello(),
                    hints(3, 1, vec![raw(0, 4096, 1)]),
                    hello(),
                    hints(1, 1, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.dropped_replay == 0 && c.frames_ok == 4,
            ),
            ("version game", [hello(), hints_v2].concat(), |c| {
                c.dropped_bad_version == 1
            }),
            (
                "no common version",
                enc(Frame::new(0, Body::Hello(Hello::new(2, 7, "future")))),
                |c| c.dropped_bad_version == 1 && c.frames_ok == 0,
            ),
            (
                "hints after a failed hello",
                [
                    enc(Frame::new(0, Body::Hello(Hello::new(2, 7, "x")))),
                    hints(1, 1, vec![raw(0, 4096, 1)]),
                ]
                .concat(),
                |c| c.dropped_before_hello == 1 && c.resync_before_hello == 0,
            ),
            ("oversize", [hello(), oversize].concat(), |c| {
                c.dropped_oversize == 1 && c.garbage_bytes > 0
            }),
            ("bad type", [hello(), bad_type].concat(), |c| {
                c.dropped_bad_type == 1
            }),
            ("host-only type", [hello(), welcome].concat(), |c| {
                c.dropped_bad_type == 1
            }),
            ("bad length", [bad_len, hello()].concat(), |c| {
                c.dropped_bad_length == 1 && c.frames_ok == 1
            }),
            (
                "out of range",
                [
                    hello(),
                    hints(
                        1,
                        1,
                        vec![
                            raw(64 * MIB, 4096, 1),
                            raw((4 << 30) + 63 * MIB, 2 * MIB, 1),
                            raw(1 << 40, 4096, 1),
                            raw(0, 4096, 1),
                        ],
                    ),
                ]
                .concat(),
                |c| c.ranges_rejected_outside_ram == 3 && c.ranges_accepted == 1,
            ),
            (
                "invalid ranges",
                [
                    hello(),
                    hints(
                        1,
                        1,
                        vec![
                            raw(1, 4096, 1),
                            raw(0, 0, 1),
                            raw(0, 4096, 9),
                            RawRange {
                                weight: 0,
                                ..raw(0, 4096, 1)
                            },
                            RawRange {
                                source: 0,
                                ..raw(0, 4096, 1)
                            },
                            RawRange {
                                reserved: [1, 0, 0, 0, 0],
                                ..raw(0, 4096, 1)
                            },
                            raw(u64::MAX - 4095, 4096, 1),
                        ],
                    ),
                ]
                .concat(),
                |c| c.ranges_rejected_invalid == 7 && c.ranges_accepted == 0,
            ),
        ];
        for (name, bytes, check) in cases {
            let (mut g, mut ch) = guest(&name.replace(' ', "-"));
            let c = exchange(&mut g, &mut ch, &bytes);
            assert!(check(&c), "{name}: {c:?}");
            let v = ch.take_violations();
            // Garbage before the first frame of a connection, and HINTS before its first
            // HELLO or BYE, are resynchronization.
            let quiet = [
                "hello resets seq",
                "garbage",
                "bad magic",
                "before hello",
                "before hello, then a session",
            ];
            assert_eq!(v.is_some(), !quiet.contains(&name), "{name}: {v:?}");
            assert!(ch.take_violations().is_none(), "{name}: reported twice");
        }
    }

    #[test]
    fn hints_without_a_hello_are_excused_only_at_connect() {
        // vmtierd connects mid-batch: HINTS before the connection's first HELLO are dropped
        // and excused for AT_CONNECT_GRACE; a guest still sending HINTS without one after
        // it is flagged. (seconds after connect, violation)
        let (mut g, mut ch) = guest("no-hello");
        let l = layout();
        let t0 = Instant::now();
        ch.poll(&l, t0);
        for (seq, (secs, flagged)) in [(1u64, false), (9, false), (11, true), (30, true)]
            .into_iter()
            .enumerate()
        {
            let seq = u32::try_from(seq).unwrap() + 1;
            g.send(&hints(seq, 1, vec![raw(0, 4096, 1)]));
            ch.poll(&l, t0 + Duration::from_secs(secs));
            let v = ch.take_violations();
            assert_eq!(v.is_some(), flagged, "{secs} s: {v:?}");
            if flagged {
                assert!(v.unwrap().contains("1 before HELLO"));
            }
        }
        let c = ch.status().counters;
        assert_eq!((c.dropped_before_hello, c.resync_before_hello), (4, 2));
    }

    #[test]
    fn a_flood_is_rate_limited_and_told_to_slow_down() {
        let (mut g, mut ch) = guest_with("flood", |c| c.frames_per_s = 10);
        let mut bytes = hello();
        for seq in 1..=100u32 {
            bytes.extend(hints(seq, 1, vec![raw(0, 4096, 1)]));
        }
        let c = exchange(&mut g, &mut ch, &bytes);
        // A full bucket holds one second of frames: the HELLO and 9 HINTS pass.
        assert_eq!(
            (c.frames_ok, c.dropped_rate, c.slow_downs_sent),
            (10, 91, 1),
            "{c:?}"
        );
        let replies = g.replies();
        assert!(
            replies.contains(&Body::SlowDown(SlowDown {
                dropped: 1,
                retry_after_ms: 1000
            })),
            "{replies:?}"
        );
        // Rate drops are not protocol violations.
        assert!(ch.take_violations().is_none());
    }

    #[test]
    fn a_long_tick_does_not_refuse_a_guest_within_its_rate() {
        // 5 frames/s. Each row: the polls after the one that connects, as (ms after it,
        // frames sent just before it), and the frames admitted and refused in the end.
        // vmtierd reads once a tick; a tick that runs long delivers everything the guest
        // sent meanwhile in one read.
        let cases: &[(&str, &[(u64, u32)], u64, u64)] = &[
            ("ticks of 1 s", &[(1000, 5), (2000, 5)], 10, 0),
            ("a burst within one tick", &[(1000, 9)], 5, 4),
            ("3.4 s tick, sent at the rate", &[(3400, 17)], 17, 0),
            ("3.4 s tick, sent over the rate", &[(3400, 25)], 17, 8),
            (
                "the excess ends at the next read",
                &[(3400, 2), (3600, 10)],
                7,
                5,
            ),
            ("a quiet second after it", &[(3400, 2), (4400, 10)], 7, 5),
        ];
        for &(name, polls, ok, refused) in cases {
            let (mut g, mut ch) = guest_with("long-tick", |c| c.frames_per_s = 5);
            let l = layout();
            let t0 = Instant::now();
            ch.poll(&l, t0);
            let mut seq = 0u32;
            for &(ms, frames) in polls {
                let mut bytes = Vec::new();
                for _ in 0..frames {
                    if seq == 0 {
                        bytes.extend(hello());
                    } else {
                        bytes.extend(hints(seq, 1, vec![raw(0, 4096, 1)]));
                    }
                    seq += 1;
                }
                g.send(&bytes);
                ch.poll(&l, t0 + Duration::from_millis(ms));
            }
            let c = ch.status().counters;
            assert_eq!(
                (c.frames_ok, c.dropped_rate),
                (ok, refused),
                "{name}: {c:?}"
            );
        }
    }

    #[test]
    fn a_huge_flood_costs_one_read_budget_per_poll() {
        let (mut g, mut ch) = guest("huge");
        let l = layout();
        ch.poll(&l, Instant::now());
        let junk = vec![b'j'; 1 << 20];
        let writer = std::thread::spawn(move || {
            g.send(&junk);
            g
        });
        let mut reads = Vec::new();
        // Poll until the writer is done (it blocks while the socket is full).
        for _ in 0..10_000 {
            std::thread::sleep(Duration::from_millis(2));
            let before = ch.status().counters.bytes_read;
            ch.poll(&l, Instant::now());
            reads.push(ch.status().counters.bytes_read - before);
            if writer.is_finished() {
                break;
            }
        }
        let _g = writer.join().unwrap();
        ch.poll(&l, Instant::now());
        assert!(
            reads.iter().all(|&n| n <= READ_PER_POLL as u64),
            "{reads:?}"
        );
        assert_eq!(
            ch.status().counters.garbage_bytes,
            ch.status().counters.bytes_read
        );
    }

    #[test]
    fn reconnects_with_back_off_and_forgets_the_session() {
        let (mut g, mut ch) = guest("reconnect");
        let l = layout();
        let t0 = Instant::now();
        ch.poll(&l, t0);
        g.send(&[hello(), hints(1, 1, vec![raw(0, 4096, 1)])].concat());
        ch.poll(&l, t0);
        assert_eq!(ch.poll(&l, t0).len(), 1);
        g.conn = None; // the VM end closes
        ch.poll(&l, t0);
        let st = ch.status();
        assert!(
            !st.connected && st.live_ranges == 0 && st.version == 0,
            "{st:?}"
        );
        // Not before the back-off.
        ch.poll(&l, t0 + Duration::from_millis(100));
        assert_eq!(ch.status().counters.connects, 1);
        ch.poll(&l, t0 + MIN_BACKOFF);
        assert_eq!(ch.status().counters.connects, 2);
        // HINTS on the new connection need a new HELLO.
        g.send(&hints(2, 1, vec![raw(0, 4096, 1)]));
        ch.poll(&l, t0 + MIN_BACKOFF);
        assert_eq!(ch.status().counters.dropped_before_hello, 1);
    }

    #[test]
    fn a_missing_socket_is_retried_with_growing_delays() {
        let mut ch = HintChannel::new(
            "none",
            HintsConfig::new("/nonexistent/h.sock".into()),
            Instant::now(),
        );
        let l = layout();
        let t0 = Instant::now();
        let mut attempts = Vec::new();
        for ms in (0..20_000).step_by(50) {
            ch.poll(&l, t0 + Duration::from_millis(ms));
            attempts.push(ch.status().counters.connect_errors);
        }
        // 0.25 + 0.5 + 1 + 2 + 4 + 8 + 8 s: attempts at 0, 0.5, 1.5, 3.5, 7.5, 15.5 s.
        assert_eq!(*attempts.last().unwrap(), 6, "{:?}", ch.status());
        assert!(ch.status().last_error.unwrap().contains("cannot connect"));
    }

    fn store_with_heat(heat: &[(u64, u64, u32)]) -> HotnessStore {
        let l = layout();
        let mut s = HotnessStore::new(
            &l,
            StoreConfig {
                granule: vmtier_core::GranuleSize::HUGE,
                ..StoreConfig::default()
            },
        )
        .unwrap();
        let reports: Vec<RegionAccess> = heat
            .iter()
            .map(|&(off, len, hits)| RegionAccess {
                start: HostVirtAddr::new(HVA + off),
                len,
                hits,
                samples: 20,
            })
            .collect();
        s.observe(&reports);
        s
    }

    fn lr(gpa: u64, len: u64, kind: HintKind, weight: u8, source: HintSource) -> LiveRange {
        LiveRange {
            range: HintRange {
                gpa,
                len,
                kind,
                weight,
                source,
            },
        }
    }

    #[test]
    fn overlaps_resolve_by_priority_and_partial_granules_by_kind() {
        use HintKind::{Cold, Free, Hot, Pinned};
        use HintSource::{App, FreePages};
        // 2 MiB granules; 64 granules in the low range, 64 in the high one (from 32).
        let hot_everywhere = store_with_heat(&[(0, 128 * MIB, 20)]);
        // (name, live, (start, len, kind, weight) out)
        let cases: Vec<(&str, Vec<LiveRange>, Vec<(u32, u32, PK, u8)>)> = vec![
            (
                "hot covers a partly hinted granule",
                vec![lr(MIB, 4096, Hot, 255, App)],
                vec![(0, 1, PK::Hot, 255)],
            ),
            (
                "cold needs whole granules",
                vec![lr(MIB, 4 * MIB, Cold, 255, App)],
                vec![],
            ),
            (
                "pinned over hot",
                vec![
                    lr(0, 8 * MIB, Hot, 9, App),
                    lr(2 * MIB, 2 * MIB, Pinned, 7, App),
                ],
                vec![
                    (0, 1, PK::Hot, 9),
                    (1, 1, PK::Pinned, 7),
                    (2, 2, PK::Hot, 9),
                ],
            ),
            (
                "heavier of equal kinds",
                vec![
                    lr(0, 4 * MIB, Hot, 9, App),
                    lr(2 * MIB, 4 * MIB, Hot, 50, App),
                ],
                vec![(0, 1, PK::Hot, 9), (1, 2, PK::Hot, 50)],
            ),
            (
                "high range maps after the low one",
                vec![lr(4 << 30, 2 * MIB, Hot, 1, App)],
                vec![(32, 1, PK::Hot, 1)],
            ),
            (
                "free on a granule the host sees hot is dropped",
                vec![lr(0, 4 * MIB, Free, 255, FreePages)],
                vec![],
            ),
        ];
        for (name, live, want) in cases {
            let mut t = HintTracker::new(5, 100);
            let got: Vec<_> = t
                .step(&live, &hot_everywhere, 1000)
                .iter()
                .map(|h| (h.start.0, h.len, h.kind, h.weight))
                .collect();
            assert_eq!(got, want, "{name}");
        }
        let cold = store_with_heat(&[]);
        let mut t = HintTracker::new(5, 100);
        let got = t.step(&[lr(0, 4 * MIB, Free, 255, FreePages)], &cold, 1000);
        assert_eq!(
            got,
            [GuestHint {
                start: Granule(0),
                len: 2,
                kind: PK::Free,
                weight: 255
            }]
        );
    }

    #[test]
    fn trust_halves_on_contradiction_and_recovers_when_consistent() {
        let cold = store_with_heat(&[]);
        let hot = store_with_heat(&[(0, 16 * MIB, 20)]);
        let claim = [lr(0, 16 * MIB, HintKind::Hot, 200, HintSource::Pmu)];
        let mut t = HintTracker::new(3, 100);
        let mut trust = Vec::new();
        for _ in 0..9 {
            t.step(&claim, &cold, 1000);
            trust.push(t.trust(HintSource::Pmu));
        }
        assert_eq!(trust, [256, 256, 128, 128, 128, 64, 64, 64, 32]);
        assert_eq!(t.hints()[0].weight, 25); // 200 * 32 / 256
        let mut back = Vec::new();
        for _ in 0..3 {
            t.step(&claim, &hot, 1000);
            back.push(t.trust(HintSource::Pmu));
        }
        assert_eq!(back, [48, 64, 80]);
        // Other sources keep their trust.
        assert_eq!(t.trust(HintSource::App), FULL_TRUST);
    }

    #[test]
    fn hot_claims_are_capped_to_a_share_of_the_budget() {
        let store = store_with_heat(&[(0, 128 * MIB, 20)]);
        let live = [
            lr(0, 64 * MIB, HintKind::Hot, 10, HintSource::App),
            lr(4 << 30, 8 * MIB, HintKind::Pinned, 1, HintSource::App),
            lr(
                (4 << 30) + 16 * MIB,
                8 * MIB,
                HintKind::Hot,
                200,
                HintSource::App,
            ),
        ];
        for (budget, percent, want) in [
            (20u64, 50u8, 10u64),
            (20, 100, 20),
            (20, 0, 0),
            (1000, 50, 40),
        ] {
            let mut t = HintTracker::new(5, percent);
            t.step(&live, &store, budget);
            assert_eq!(t.hinted_granules, want, "budget {budget}, {percent}%");
            // Pinned first, then the heavier hot claim.
            if want >= 8 {
                assert!(t.hints().iter().any(|h| h.kind == PK::Pinned && h.len == 4));
                assert!(t.hints().iter().any(|h| h.weight == 200 && h.len == 4));
            }
        }
    }
}
