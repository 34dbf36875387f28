//! The agent's side of a hint-protocol session, free of I/O: HELLO and WELCOME, sequence
//! numbers, HINTS batches cut to the host's limits, the agent's own token buckets (90 % of
//! the host's rates, so transport jitter does not trip the host's), SLOW_DOWN, ACK
//! counters and BYE. The caller feeds received bytes in and writes [`Session::output`] out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use vmtier_hint_proto::{
    bye, Body, Bye, DecodeError, Decoder, Frame, Hello, Hints, RawRange, Welcome, FLAG_REPLACE,
    HEADER_BYTES, HINTS_HEAD_BYTES, MAX_RANGES_PER_FRAME, RANGE_BYTES, VERSION,
};

use crate::ranges::{Hint, PAGE};

/// Largest output backlog, bytes: one snapshot's frames are queued as frames, not bytes,
/// so this only holds the frames already admitted by the buckets.
const MAX_OUTPUT_BYTES: usize = 256 * 1024;

/// Share of the host's rates the agent uses, permille.
const RATE_SHARE_PERMILLE: u64 = 900;

/// A token bucket: `rate` per second, holding at most one second's worth.
#[derive(Clone, Debug)]
pub struct Bucket {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(rate: u64, now: Instant) -> Self {
        Self {
            rate,
            tokens: rate as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate as f64).min(self.rate as f64);
        self.at = now;
    }

    /// Takes `n` tokens if there are enough.
    pub fn take(&mut self, n: u64, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= n as f64 {
            self.tokens -= n as f64;
            true
        } else {
            false
        }
    }

    /// Time until `n` tokens are there (`None` if never: `n` > capacity).
    pub fn wait_for(&mut self, n: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        if n > self.rate {
            return None;
        }
        let missing = (n as f64 - self.tokens).max(0.0);
        Some(Duration::from_secs_f64(missing / self.rate.max(1) as f64))
    }

    /// Its rate.
    pub fn rate(&self) -> u64 {
        self.rate
    }
}

/// What a received frame meant for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The host accepted the HELLO: a session is up; send a snapshot now.
    Welcome(Welcome),
    /// The host ended the session with this reason.
    Bye(u32),
    /// The host asked the agent to slow down.
    SlowDown {
        /// Frames the host dropped.
        dropped: u32,
        /// Pause, ms.
        retry_after_ms: u32,
    },
    /// A frame the agent cannot use (logged and counted).
    Bad(String),
}

/// Counters shown in the agent's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// HELLOs sent.
    pub hellos: u64,
    /// HINTS frames sent.
    pub frames: u64,
    /// Ranges sent.
    pub ranges: u64,
    /// Ranges the host accepted (ACKs).
    pub accepted: u64,
    /// Ranges the host rejected (ACKs).
    pub rejected: u64,
    /// SLOW_DOWN notices.
    pub slow_downs: u64,
    /// Queued frames dropped because a newer snapshot replaced them.
    pub superseded: u64,
    /// Received bytes or frames the agent could not use.
    pub bad_input: u64,
}

/// Limits of the current session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Ranges per HINTS frame.
    pub ranges_per_frame: usize,
}

#[derive(Debug)]
enum State {
    /// No session; HELLO not sent (or to be sent again).
    Idle,
    /// HELLO sent at this instant.
    HelloSent(Instant),
    /// WELCOME received.
    Up(Welcome),
}

/// One session.
#[derive(Debug)]
pub struct Session {
    name: String,
    state: State,
    seq: u32,
    decoder: Decoder,
    out: Vec<u8>,
    queue: VecDeque<Frame>,
    frames: Bucket,
    bytes: Bucket,
    max_frames_per_s: u32,
    max_bytes_per_s: u32,
    paused_until: Option<Instant>,
    /// Counters.
    pub stats: Stats,
}

impl Session {
    /// A session that has not said HELLO yet. `max_*` cap the host's rates.
    pub fn new(name: &str, max_frames_per_s: u32, max_bytes_per_s: u32, now: Instant) -> Self {
        Self {
            name: name.to_owned(),
            state: State::Idle,
            seq: 0,
            decoder: Decoder::new(),
            out: Vec::new(),
            queue: VecDeque::new(),
            frames: Bucket::new(u64::from(max_frames_per_s), now),
            bytes: Bucket::new(u64::from(max_bytes_per_s), now),
            max_frames_per_s,
            max_bytes_per_s,
            paused_until: None,
            stats: Stats::default(),
        }
    }

    /// Whether WELCOME has arrived.
    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up(_))
    }

    /// When HELLO was last sent, while no WELCOME came.
    pub fn hello_sent_at(&self) -> Option<Instant> {
        match self.state {
            State::HelloSent(t) => Some(t),
            _ => None,
        }
    }

    /// Forgets the session (host gone): queued frames and partial input are dropped.
    pub fn reset(&mut self) {
        self.state = State::Idle;
        self.decoder.reset();
        self.out.clear();
        self.queue.clear();
        self.paused_until = None;
    }

    /// Starts (or restarts) the session: queues a HELLO (seq 0; HINTS count from 1).
    pub fn hello(&mut self, now: Instant) {
        self.reset();
        self.seq = 0;
        let f = Frame::new(0, Body::Hello(Hello::new(VERSION, VERSION, &self.name)));
        // A HELLO always encodes (fixed size).
        let _ = f.encode(&mut self.out);
        self.stats.hellos += 1;
        self.state = State::HelloSent(now);
    }

    /// Queues a BYE with `reason` (normal end).
    pub fn bye(&mut self, reason: u32) {
        self.seq = self.seq.saturating_add(1);
        let f = Frame::new(self.seq, Body::Bye(Bye { reason }));
        let _ = f.encode(&mut self.out);
        self.state = State::Idle;
    }

    /// Limits of the session (`None` before WELCOME).
    pub fn limits(&self) -> Option<Limits> {
        let State::Up(w) = &self.state else {
            return None;
        };
        let frame_cap = (w.max_frame_bytes as usize)
            .min(usize::try_from(self.bytes.rate()).unwrap_or(usize::MAX))
            .saturating_sub(HEADER_BYTES + HINTS_HEAD_BYTES)
            / RANGE_BYTES;
        Some(Limits {
            ranges_per_frame: frame_cap
                .min(MAX_RANGES_PER_FRAME)
                .min(w.max_ranges as usize),
        })
    }

    /// Replaces whatever is still queued by the frames of one snapshot: per source, its
    /// hints cut into frames of at most the session's ranges per frame, the first with
    /// REPLACE (the host drops that source's earlier hints), the others adding to it.
    /// Sources with no hints send nothing (v1 has no empty batch). Returns frames queued.
    pub fn queue_snapshot(&mut self, epoch: u64, hints: &[Hint]) -> usize {
        let Some(limits) = self.limits() else {
            return 0;
        };
        let per = limits.ranges_per_frame.max(1);
        self.stats.superseded += self.queue.len() as u64;
        self.queue.clear();
        for src in crate::ranges::SOURCES {
            let raw: Vec<RawRange> = hints
                .iter()
                .filter(|h| h.source == src)
                .filter_map(to_raw)
                .collect();
            for (i, chunk) in raw.chunks(per).enumerate() {
                // Sequence numbers are given when a frame leaves the queue.
                self.queue.push_back(Frame::new(
                    0,
                    Body::Hints(Hints {
                        epoch,
                        flags: if i == 0 { FLAG_REPLACE } else { 0 },
                        ranges: chunk.to_vec(),
                    }),
                ));
            }
        }
        self.queue.len()
    }

    /// Frames still queued.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Moves queued frames to the output as the buckets allow. Returns when to call again
    /// (`None`: nothing queued).
    pub fn pump(&mut self, now: Instant) -> Option<Instant> {
        if !self.is_up() {
            return None;
        }
        if let Some(t) = self.paused_until {
            if now < t {
                return Some(t);
            }
            self.paused_until = None;
        }
        while let Some(f) = self.queue.front() {
            let len = f.encoded_len() as u64;
            if self.out.len() + f.encoded_len() > MAX_OUTPUT_BYTES {
                // The port is not draining; try again shortly.
                return Some(now + Duration::from_millis(100));
            }
            let fw = self.frames.wait_for(1, now);
            let bw = self.bytes.wait_for(len, now);
            let (Some(fw), Some(bw)) = (fw, bw) else {
                // Larger than one second of the byte rate (rates were cut): drop it.
                self.queue.pop_front();
                self.stats.superseded += 1;
                continue;
            };
            if !fw.is_zero() || !bw.is_zero() {
                return Some(now + fw.max(bw).max(Duration::from_millis(1)));
            }
            self.frames.take(1, now);
            self.bytes.take(len, now);
            let mut f = self.queue.pop_front()?;
            self.seq = self.seq.saturating_add(1);
            f.seq = self.seq;
            if let Body::Hints(h) = &f.body {
                self.stats.ranges += h.ranges.len() as u64;
            }
            self.stats.frames += 1;
            let _ = f.encode(&mut self.out);
        }
        None
    }

    /// Bytes waiting to be written.
    pub fn output(&self) -> &[u8] {
        &self.out
    }

    /// Drops the first `n` output bytes (written).
    pub fn consume_output(&mut self, n: usize) {
        self.out.drain(..n.min(self.out.len()));
    }

    /// Feeds received bytes; returns what they meant.
    pub fn receive(&mut self, mut input: &[u8], now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let n = self.decoder.feed(input);
            input = &input[n..];
            while let Some(r) = self.decoder.next_frame(|_| true) {
                match r {
                    Ok(f) => self.on_frame(&f, now, &mut events),
                    Err(e) => self.bad(&mut events, describe(&e)),
                }
            }
            if input.is_empty() || n == 0 {
                break;
            }
        }
        events
    }

    fn bad(&mut self, events: &mut Vec<Event>, what: String) {
        self.stats.bad_input += 1;
        events.push(Event::Bad(what));
    }

    fn on_frame(&mut self, f: &Frame, now: Instant, events: &mut Vec<Event>) {
        match &f.body {
            Body::Welcome(w) => {
                if w.version != VERSION {
                    return self.bad(events, format!("WELCOME for version {}", w.version));
                }
                if !matches!(self.state, State::HelloSent(_)) {
                    return self.bad(events, "WELCOME without a HELLO".into());
                }
                let share = |host: u32, cap: u32| {
                    (u64::from(host.min(cap)) * RATE_SHARE_PERMILLE / 1000).max(1)
                };
                self.frames = Bucket::new(share(w.frames_per_s, self.max_frames_per_s), now);
                self.bytes = Bucket::new(share(w.bytes_per_s, self.max_bytes_per_s), now);
                self.state = State::Up(*w);
                events.push(Event::Welcome(*w));
            }
            Body::Ack(a) => {
                if a.acked_seq > self.seq {
                    return self.bad(events, format!("ACK of unsent seq {}", a.acked_seq));
                }
                self.stats.accepted += u64::from(a.accepted);
                self.stats.rejected += u64::from(a.rejected);
            }
            Body::SlowDown(s) => {
                self.stats.slow_downs += 1;
                let pause = Duration::from_millis(u64::from(s.retry_after_ms.clamp(100, 60_000)));
                self.paused_until = Some(now + pause);
                // Halve both rates until the next WELCOME.
                let fr = (self.frames.rate() / 2).max(1);
                let br = (self.bytes.rate() / 2).max(4096);
                self.frames = Bucket::new(fr, now + pause);
                self.bytes = Bucket::new(br, now + pause);
                events.push(Event::SlowDown {
                    dropped: s.dropped,
                    retry_after_ms: s.retry_after_ms,
                });
            }
            Body::Bye(b) => {
                self.reset();
                events.push(Event::Bye(b.reason));
            }
            Body::Hello(_) | Body::Hints(_) => self.bad(
                events,
                format!("{:?} frame from the host", f.body.frame_type()),
            ),
        }
    }
}

fn describe(e: &DecodeError) -> String {
    format!("{} ({e})", e.reason())
}

/// A hint's wire range (`None` if its address does not fit 64 bits).
pub fn to_raw(h: &Hint) -> Option<RawRange> {
    let gpa = h.range.start.gpa()?;
    let len = h.range.pages.checked_mul(PAGE)?;
    gpa.checked_add(len)?;
    Some(RawRange {
        gpa,
        len,
        kind: h.kind.wire() as u8,
        weight: h.weight.max(1),
        source: h.source as u8,
        reserved: [0; 5],
    })
}

/// The name of a BYE reason.
pub fn bye_reason(r: u32) -> &'static str {
    match r {
        bye::NORMAL => "normal",
        bye::PROTOCOL_ERROR => "protocol error",
        bye::VERSION_UNSUPPORTED => "version unsupported",
        bye::SHUTTING_DOWN => "shutting down",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::{Kind, Pfn, PfnRange, Source};
    use vmtier_hint_proto::{Ack, SlowDown};

    fn welcome(frames_per_s: u32, bytes_per_s: u32, max_ranges: u32) -> Vec<u8> {
        let mut v = Vec::new();
        Frame::new(
            1,
            Body::Welcome(Welcome {
                version: 1,
                max_frame_bytes: 65536,
                max_ranges,
                frames_per_s,
                bytes_per_s,
            }),
        )
        .encode(&mut v)
        .unwrap();
        v
    }

    fn hints(n: u64, source: Source) -> Vec<Hint> {
        (0..n)
            .map(|i| Hint {
                range: PfnRange {
                    start: Pfn(i * 2),
                    pages: 1,
                },
                kind: Kind::Free,
                weight: 9,
                source,
            })
            .collect()
    }

    /// Decodes everything the session wrote.
    fn sent(s: &mut Session) -> Vec<Frame> {
        let mut d = Decoder::new();
        let out = s.output().to_vec();
        s.consume_output(out.len());
        assert_eq!(d.feed(&out), out.len());
        let mut v = Vec::new();
        while let Some(r) = d.next_frame(|_| true) {
            v.push(r.expect("the agent's frames decode"));
        }
        v
    }

    fn up(now: Instant, fps: u32, bps: u32, max_ranges: u32) -> Session {
        let mut s = Session::new("t", 20, 256 * 1024, now);
        s.hello(now);
        let f = sent(&mut s);
        assert!(matches!(
            f[..],
            [Frame {
                seq: 0,
                body: Body::Hello(_),
                ..
            }]
        ));
        let ev = s.receive(&welcome(fps, bps, max_ranges), now);
        assert!(matches!(ev[..], [Event::Welcome(_)]), "{ev:?}");
        s
    }

    #[test]
    fn batches_per_source_with_replace_first() {
        let now = Instant::now();
        // (ranges per source, host max_ranges) -> frames expected per source
        let cases: &[(u64, u32, usize)] =
            &[(1, 2048, 1), (2048, 2048, 1), (2049, 2048, 2), (10, 4, 3)];
        for &(n, max_ranges, want) in cases {
            let mut s = up(now, 1000, 10 << 20, max_ranges);
            let mut h = hints(n, Source::FreePages);
            h.extend(hints(1, Source::App));
            assert_eq!(s.queue_snapshot(7, &h), want + 1);
            assert_eq!(s.pump(now), None);
            let f = sent(&mut s);
            assert_eq!(f.len(), want + 1);
            let mut total = 0;
            for (i, fr) in f.iter().enumerate() {
                assert_eq!(fr.seq as usize, i + 1);
                let Body::Hints(b) = &fr.body else { panic!() };
                assert_eq!(b.epoch, 7);
                let first_of_source = i == 0 || i == want;
                assert_eq!(b.flags == FLAG_REPLACE, first_of_source, "frame {i}");
                assert!(b.ranges.len() <= max_ranges as usize);
                for r in &b.ranges {
                    r.check().unwrap();
                }
                total += b.ranges.len();
            }
            assert_eq!(total as u64, n + 1);
        }
    }

    #[test]
    fn keeps_to_the_rate_and_obeys_slow_down() {
        let now = Instant::now();
        // 10 frames/s from the host -> 9/s for the agent, a full bucket of 9.
        let mut s = up(now, 10, 10 << 20, 1);
        s.queue_snapshot(1, &hints(30, Source::FreePages));
        let next = s.pump(now).expect("more to send");
        assert_eq!(sent(&mut s).len(), 9);
        assert!(next > now);
        // One second later nine more.
        let t1 = now + Duration::from_secs(1);
        s.pump(t1);
        assert_eq!(sent(&mut s).len(), 9);
        // SLOW_DOWN: nothing for retry_after_ms, then at half the rate.
        let mut v = Vec::new();
        Frame::new(
            2,
            Body::SlowDown(SlowDown {
                dropped: 3,
                retry_after_ms: 500,
            }),
        )
        .encode(&mut v)
        .unwrap();
        let ev = s.receive(&v, t1);
        assert_eq!(
            ev,
            vec![Event::SlowDown {
                dropped: 3,
                retry_after_ms: 500
            }]
        );
        assert!(s.pump(t1 + Duration::from_millis(400)).is_some());
        assert!(sent(&mut s).is_empty());
        s.pump(t1 + Duration::from_millis(600));
        assert_eq!(sent(&mut s).len(), 4);
        assert_eq!(s.stats.slow_downs, 1);
    }

    #[test]
    fn acks_byes_and_bad_input() {
        let now = Instant::now();
        let mut s = up(now, 100, 1 << 20, 2048);
        s.queue_snapshot(1, &hints(3, Source::App));
        s.pump(now);
        sent(&mut s);
        let mut v = Vec::new();
        Frame::new(
            2,
            Body::Ack(Ack {
                acked_seq: 1,
                accepted: 2,
                rejected: 1,
            }),
        )
        .encode(&mut v)
        .unwrap();
        Frame::new(
            3,
            Body::Ack(Ack {
                acked_seq: 9,
                accepted: 2,
                rejected: 1,
            }),
        )
        .encode(&mut v)
        .unwrap();
        v.extend_from_slice(b"junk");
        Frame::new(4, Body::Bye(Bye { reason: 3 }))
            .encode(&mut v)
            .unwrap();
        let ev = s.receive(&v, now);
        assert_eq!((s.stats.accepted, s.stats.rejected), (2, 1));
        assert!(matches!(ev[0], Event::Bad(_)));
        assert!(matches!(ev[1], Event::Bad(_)));
        assert_eq!(ev[2], Event::Bye(3));
        assert!(!s.is_up());
        assert_eq!(s.queue_snapshot(2, &hints(1, Source::App)), 0);
        // A WELCOME without HELLO is refused.
        assert!(matches!(
            s.receive(&welcome(1, 4096, 1), now)[..],
            [Event::Bad(_)]
        ));
    }
}
