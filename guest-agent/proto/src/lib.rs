//! vmtier hint protocol v1: the frames a guest agent and vmtierd exchange over a byte
//! stream (a virtio-serial port or a serial line), see `docs/hint-protocol.md`.
//!
//! - [`Frame`] and [`Body`]: one type per frame; [`Frame::encode`] and
//!   [`Frame::encode_into`] write them.
//! - [`Decoder`]: incremental; bytes are fed as they arrive, frames or typed errors come
//!   out. It resynchronizes on the magic after garbage, holds at most one maximal frame
//!   ([`MAX_FRAME_BYTES`]) and never panics, whatever the input.
//! - [`RawRange::check`]: the per-range rules of a HINTS frame (alignment, kind, weight,
//!   source, reserved bytes); whether a range lies in guest RAM is the host's business.
//!
//! All integers are little-endian. The crate has no runtime dependencies so that the guest
//! agent can link it statically.

use std::fmt;

/// The frame magic, bytes `V`,`M`,`T`,`H`.
pub const MAGIC: [u8; 4] = *b"VMTH";
/// [`MAGIC`] read as a little-endian u32.
pub const MAGIC_U32: u32 = 0x4854_4D56;
/// The protocol version this crate implements.
pub const VERSION: u16 = 1;
/// Lowest version the host supports.
pub const HOST_MIN_VERSION: u16 = 1;
/// Highest version the host supports.
pub const HOST_MAX_VERSION: u16 = 1;
/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 16;
/// Largest payload, bytes.
pub const MAX_PAYLOAD_BYTES: usize = 65_520;
/// Largest frame (header + payload), bytes: 64 KiB.
pub const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_PAYLOAD_BYTES;
/// Payload bytes of a HELLO frame.
pub const HELLO_BYTES: usize = 40;
/// Payload bytes of a WELCOME frame.
pub const WELCOME_BYTES: usize = 20;
/// Payload bytes of an ACK frame.
pub const ACK_BYTES: usize = 16;
/// Payload bytes of a SLOW_DOWN frame.
pub const SLOW_DOWN_BYTES: usize = 8;
/// Payload bytes of a BYE frame.
pub const BYE_BYTES: usize = 4;
/// Bytes of a HINTS payload before its ranges (epoch, count, flags).
pub const HINTS_HEAD_BYTES: usize = 16;
/// Bytes of one range in a HINTS payload.
pub const RANGE_BYTES: usize = 24;
/// Most ranges in one HINTS frame.
pub const MAX_RANGES_PER_FRAME: usize = 2048;
/// Bytes of the agent name in a HELLO, NUL-padded UTF-8.
pub const AGENT_NAME_BYTES: usize = 32;
/// Alignment of a range's address and length, bytes.
pub const RANGE_ALIGN_BYTES: u64 = 4096;
/// HINTS flag: this batch replaces every earlier hint of the same sources.
pub const FLAG_REPLACE: u32 = 1;
/// Every flag bit v1 defines.
pub const KNOWN_FLAGS: u32 = FLAG_REPLACE;
/// Host default: frames per second a VM may send (token bucket rate).
pub const DEFAULT_FRAMES_PER_S: u32 = 20;
/// Host default: bytes per second a VM may send (token bucket rate), 256 KiB.
pub const DEFAULT_BYTES_PER_S: u32 = 256 * 1024;
/// Host limit: frames buffered per VM.
pub const MAX_BUFFERED_FRAMES: usize = 4;
/// Host limit: live hint ranges kept per VM.
pub const MAX_LIVE_RANGES: usize = 65_536;
/// Host rule: at most one SLOW_DOWN per this many milliseconds.
pub const SLOW_DOWN_INTERVAL_MS: u32 = 1000;

// A full HINTS frame fits the payload limit.
const _: () = assert!(HINTS_HEAD_BYTES + RANGE_BYTES * MAX_RANGES_PER_FRAME <= MAX_PAYLOAD_BYTES);

/// Frame types (the header's `type` field).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum FrameType {
    /// Guest to host: opens (or reopens) a session.
    Hello = 1,
    /// Host to guest: the negotiated version and the host's limits.
    Welcome = 2,
    /// Guest to host: a batch of hint ranges.
    Hints = 3,
    /// Host to guest: how many ranges of a HINTS frame were kept.
    Ack = 4,
    /// Host to guest: frames were dropped by the rate limit.
    SlowDown = 5,
    /// Either way: the session ends.
    Bye = 6,
}

impl FrameType {
    /// The type for a header's `type` field, `None` if v1 does not define it.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Welcome,
            3 => Self::Hints,
            4 => Self::Ack,
            5 => Self::SlowDown,
            6 => Self::Bye,
            _ => return None,
        })
    }

    /// Whether `len` payload bytes are valid for this type (HINTS: 16 + 24 * count with
    /// count in 1..=2048).
    pub fn payload_len_ok(self, len: usize) -> bool {
        match self {
            Self::Hello => len == HELLO_BYTES,
            Self::Welcome => len == WELCOME_BYTES,
            Self::Ack => len == ACK_BYTES,
            Self::SlowDown => len == SLOW_DOWN_BYTES,
            Self::Bye => len == BYE_BYTES,
            Self::Hints => {
                let Some(body) = len.checked_sub(HINTS_HEAD_BYTES) else {
                    return false;
                };
                body % RANGE_BYTES == 0
                    && (1..=MAX_RANGES_PER_FRAME).contains(&(body / RANGE_BYTES))
            }
        }
    }
}

/// A frame header as read from the wire (type and version not yet judged).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Header {
    /// Protocol version of this frame.
    pub version: u16,
    /// Raw frame type.
    pub ftype: u16,
    /// Sender's sequence number.
    pub seq: u32,
    /// Payload bytes.
    pub len: u32,
}

impl Header {
    /// Parses 16 header bytes; `None` if the magic is wrong.
    fn parse(b: &[u8; HEADER_BYTES]) -> Option<Self> {
        if b[0..4] != MAGIC {
            return None;
        }
        Some(Self {
            version: u16::from_le_bytes([b[4], b[5]]),
            ftype: u16::from_le_bytes([b[6], b[7]]),
            seq: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            len: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }

    /// Whole frame bytes (header + payload).
    pub fn frame_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + u64::from(self.len)
    }
}

/// HELLO: the guest opens a session and offers a version range.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Hello {
    /// Lowest version the agent speaks.
    pub min_version: u16,
    /// Highest version the agent speaks.
    pub max_version: u16,
    /// Feature bits (v1: 0).
    pub features: u32,
    /// Agent name, NUL-padded UTF-8.
    pub name: [u8; AGENT_NAME_BYTES],
}

impl Hello {
    /// A HELLO for versions `min..=max` with `name` truncated to 32 bytes (at a char
    /// boundary) and NUL-padded.
    pub fn new(min_version: u16, max_version: u16, name: &str) -> Self {
        let mut buf = [0u8; AGENT_NAME_BYTES];
        let mut end = name.len().min(AGENT_NAME_BYTES);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        buf[..end].copy_from_slice(&name.as_bytes()[..end]);
        Self {
            min_version,
            max_version,
            features: 0,
            name: buf,
        }
    }

    /// The name up to its first NUL, printable ASCII only (anything else becomes `?`), for
    /// logs and status: the guest controls these bytes.
    pub fn name_lossy(&self) -> String {
        self.name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| {
                if c.is_ascii_graphic() || c == b' ' {
                    char::from(c)
                } else {
                    '?'
                }
            })
            .collect()
    }

    /// The version both sides speak, the highest of the overlap of `min..=max` with
    /// `host_min..=host_max`; `None` if they do not overlap.
    pub fn negotiate(&self, host_min: u16, host_max: u16) -> Option<u16> {
        let lo = self.min_version.max(host_min);
        let hi = self.max_version.min(host_max);
        (self.min_version <= self.max_version && lo <= hi).then_some(hi)
    }
}

/// WELCOME: the host's answer to a HELLO.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Welcome {
    /// Negotiated version.
    pub version: u16,
    /// Largest frame the host accepts, bytes.
    pub max_frame_bytes: u32,
    /// Most ranges per HINTS frame.
    pub max_ranges: u32,
    /// Frames per second the host accepts from this VM.
    pub frames_per_s: u32,
    /// Bytes per second the host accepts from this VM.
    pub bytes_per_s: u32,
}

/// What a guest claims about a range.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum HintKind {
    /// Accessed often: belongs in the fast tier.
    Hot = 1,
    /// Rarely accessed.
    Cold = 2,
    /// Free in the guest: content does not matter.
    Free = 3,
    /// Latency-critical: keep in the fast tier.
    Pinned = 4,
}

impl HintKind {
    /// The kind for a wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hot,
            2 => Self::Cold,
            3 => Self::Free,
            4 => Self::Pinned,
            _ => return None,
        })
    }
}

/// Where in the guest a hint comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum HintSource {
    /// An application through the agent's local socket.
    App = 1,
    /// Per-process ranges translated through pagemap.
    Process = 2,
    /// Pages the guest kernel has free.
    FreePages = 3,
    /// The guest's own DAMON.
    GuestDamon = 4,
    /// Performance-counter samples with physical addresses.
    Pmu = 5,
}

impl HintSource {
    /// Number of sources v1 defines.
    pub const COUNT: usize = 5;

    /// The source for a wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::App,
            2 => Self::Process,
            3 => Self::FreePages,
            4 => Self::GuestDamon,
            5 => Self::Pmu,
            _ => return None,
        })
    }

    /// Dense index 0..COUNT.
    pub fn index(self) -> usize {
        self as usize - 1
    }
}

/// One range of a HINTS frame exactly as on the wire (not yet judged).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RawRange {
    /// Guest-physical start, bytes.
    pub gpa: u64,
    /// Length, bytes.
    pub len: u64,
    /// [`HintKind`] byte.
    pub kind: u8,
    /// Weight, 1..=255.
    pub weight: u8,
    /// [`HintSource`] byte.
    pub source: u8,
    /// Must be zero.
    pub reserved: [u8; 5],
}

/// A range that passed [`RawRange::check`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HintRange {
    /// Guest-physical start, bytes, 4 KiB aligned.
    pub gpa: u64,
    /// Length, bytes, 4 KiB aligned, > 0, `gpa + len` does not overflow.
    pub len: u64,
    /// What the guest claims.
    pub kind: HintKind,
    /// Weight, 1..=255.
    pub weight: u8,
    /// Where in the guest the hint comes from.
    pub source: HintSource,
}

impl HintRange {
    /// The raw form of this range.
    pub fn to_raw(&self) -> RawRange {
        RawRange {
            gpa: self.gpa,
            len: self.len,
            kind: self.kind as u8,
            weight: self.weight,
            source: self.source as u8,
            reserved: [0; 5],
        }
    }

    /// One past the last byte (cannot overflow: checked by [`RawRange::check`]).
    pub fn end(&self) -> u64 {
        self.gpa.saturating_add(self.len)
    }
}

/// Why one range of a HINTS frame was rejected.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RangeError {
    /// Address or length not a multiple of 4 KiB.
    #[error("Range not 4 KiB aligned")]
    Unaligned,
    /// Zero length.
    #[error("Empty range")]
    Empty,
    /// `gpa + len` overflows.
    #[error("Range wraps around")]
    Overflow,
    /// Kind byte undefined.
    #[error("Unknown hint kind {0}")]
    BadKind(u8),
    /// Weight 0.
    #[error("Zero weight")]
    BadWeight,
    /// Source byte undefined.
    #[error("Unknown hint source {0}")]
    BadSource(u8),
    /// Reserved bytes not zero.
    #[error("Reserved bytes not zero")]
    Reserved,
}

impl RawRange {
    /// Checks the rules every range must meet on its own.
    pub fn check(&self) -> Result<HintRange, RangeError> {
        if self.gpa % RANGE_ALIGN_BYTES != 0 || self.len % RANGE_ALIGN_BYTES != 0 {
            return Err(RangeError::Unaligned);
        }
        if self.len == 0 {
            return Err(RangeError::Empty);
        }
        if self.gpa.checked_add(self.len).is_none() {
            return Err(RangeError::Overflow);
        }
        let kind = HintKind::from_u8(self.kind).ok_or(RangeError::BadKind(self.kind))?;
        if self.weight == 0 {
            return Err(RangeError::BadWeight);
        }
        let source = HintSource::from_u8(self.source).ok_or(RangeError::BadSource(self.source))?;
        if self.reserved != [0; 5] {
            return Err(RangeError::Reserved);
        }
        Ok(HintRange {
            gpa: self.gpa,
            len: self.len,
            kind,
            weight: self.weight,
            source,
        })
    }
}

/// HINTS: a batch of ranges.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hints {
    /// Guest snapshot counter, non-decreasing.
    pub epoch: u64,
    /// Flag bits ([`FLAG_REPLACE`]).
    pub flags: u32,
    /// 1..=2048 ranges, unjudged.
    pub ranges: Vec<RawRange>,
}

/// ACK: the host's verdict on one HINTS frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ack {
    /// `seq` of the HINTS frame.
    pub acked_seq: u32,
    /// Ranges kept.
    pub accepted: u32,
    /// Ranges rejected.
    pub rejected: u32,
}

/// SLOW_DOWN: the host dropped frames over its rate limit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SlowDown {
    /// Frames dropped since the last notice.
    pub dropped: u32,
    /// Milliseconds to wait before sending again.
    pub retry_after_ms: u32,
}

/// BYE reasons.
pub mod bye {
    /// Normal end.
    pub const NORMAL: u32 = 0;
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// No common version.
    pub const VERSION_UNSUPPORTED: u32 = 2;
    /// The sender is shutting down.
    pub const SHUTTING_DOWN: u32 = 3;
}

/// BYE: the session ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Bye {
    /// One of [`bye`]'s constants (others are kept as sent).
    pub reason: u32,
}

/// A frame's payload.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Body {
    /// HELLO.
    Hello(Hello),
    /// WELCOME.
    Welcome(Welcome),
    /// HINTS.
    Hints(Hints),
    /// ACK.
    Ack(Ack),
    /// SLOW_DOWN.
    SlowDown(SlowDown),
    /// BYE.
    Bye(Bye),
}

impl Body {
    /// This payload's frame type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Self::Hello(_) => FrameType::Hello,
            Self::Welcome(_) => FrameType::Welcome,
            Self::Hints(_) => FrameType::Hints,
            Self::Ack(_) => FrameType::Ack,
            Self::SlowDown(_) => FrameType::SlowDown,
            Self::Bye(_) => FrameType::Bye,
        }
    }

    /// Payload bytes once encoded.
    pub fn payload_len(&self) -> usize {
        match self {
            Self::Hello(_) => HELLO_BYTES,
            Self::Welcome(_) => WELCOME_BYTES,
            Self::Ack(_) => ACK_BYTES,
            Self::SlowDown(_) => SLOW_DOWN_BYTES,
            Self::Bye(_) => BYE_BYTES,
            Self::Hints(h) => {
                HINTS_HEAD_BYTES.saturating_add(h.ranges.len().saturating_mul(RANGE_BYTES))
            }
        }
    }
}

/// A whole frame.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    /// Protocol version written into the header ([`VERSION`] unless testing).
    pub version: u16,
    /// Sequence number.
    pub seq: u32,
    /// Payload.
    pub body: Body,
}

/// Why a frame could not be encoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum EncodeError {
    /// A HINTS frame needs 1..=2048 ranges.
    #[error("HINTS frame with {0} ranges (1..=2048)")]
    RangeCount(usize),
    /// The output buffer is shorter than the frame.
    #[error("Buffer of {have} bytes too small for a {need}-byte frame")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
}

impl Frame {
    /// A frame of the current [`VERSION`].
    pub fn new(seq: u32, body: Body) -> Self {
        Self {
            version: VERSION,
            seq,
            body,
        }
    }

    /// Frame bytes once encoded (header + payload).
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES.saturating_add(self.body.payload_len())
    }

    /// Writes the frame at the start of `buf`; returns the bytes written.
    pub fn encode_into(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        if let Body::Hints(h) = &self.body {
            if !(1..=MAX_RANGES_PER_FRAME).contains(&h.ranges.len()) {
                return Err(EncodeError::RangeCount(h.ranges.len()));
            }
        }
        let need = self.encoded_len();
        let have = buf.len();
        let out = buf
            .get_mut(..need)
            .ok_or(EncodeError::BufferTooSmall { need, have })?;
        let mut w = Writer { buf: out, pos: 0 };
        let payload = u32::try_from(self.body.payload_len()).unwrap_or(u32::MAX);
        w.bytes(&MAGIC);
        w.u16(self.version);
        w.u16(self.body.frame_type() as u16);
        w.u32(self.seq);
        w.u32(payload);
        match &self.body {
            Body::Hello(h) => {
                w.u16(h.min_version);
                w.u16(h.max_version);
                w.u32(h.features);
                w.bytes(&h.name);
            }
            Body::Welcome(x) => {
                w.u16(x.version);
                w.u16(0);
                w.u32(x.max_frame_bytes);
                w.u32(x.max_ranges);
                w.u32(x.frames_per_s);
                w.u32(x.bytes_per_s);
            }
            Body::Hints(h) => {
                w.u64(h.epoch);
                // Range count checked above: at most 2048.
                w.u32(u32::try_from(h.ranges.len()).unwrap_or(u32::MAX));
                w.u32(h.flags);
                for r in &h.ranges {
                    w.u64(r.gpa);
                    w.u64(r.len);
                    w.bytes(&[r.kind, r.weight, r.source]);
                    w.bytes(&r.reserved);
                }
            }
            Body::Ack(a) => {
                w.u32(a.acked_seq);
                w.u32(a.accepted);
                w.u32(a.rejected);
                w.u32(0);
            }
            Body::SlowDown(s) => {
                w.u32(s.dropped);
                w.u32(s.retry_after_ms);
            }
            Body::Bye(b) => w.u32(b.reason),
        }
        debug_assert_eq!(w.pos, need);
        Ok(need)
    }

    /// Appends the frame to `out`; returns the bytes written.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
        let start = out.len();
        out.resize(start.saturating_add(self.encoded_len()), 0);
        match self.encode_into(&mut out[start..]) {
            Ok(n) => Ok(n),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }
}

/// Writes into a slice already sized to the frame (callers check the length first).
struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        let end = self.pos.saturating_add(b.len());
        if let Some(dst) = self.buf.get_mut(self.pos..end) {
            dst.copy_from_slice(b);
        }
        self.pos = end;
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Reads from a payload whose length was checked against its type (reads past the end
/// yield zeros instead of panicking, which the length check makes unreachable).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let end = self.pos.saturating_add(N);
        if let Some(src) = self.buf.get(self.pos..end) {
            out.copy_from_slice(src);
        }
        self.pos = end;
        out
    }
    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

/// Why the decoder dropped bytes or a frame. Each variant is one counter on the host.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DecodeError {
    /// Bytes before the next magic, discarded.
    #[error("{bytes} garbage bytes before a frame")]
    Garbage {
        /// Bytes discarded.
        bytes: usize,
    },
    /// A header announced more than 65520 payload bytes; its 16 bytes are dropped and the
    /// decoder looks for the next magic.
    #[error("Frame of {len} payload bytes over the limit")]
    Oversize {
        /// Announced payload bytes.
        len: u32,
    },
    /// The caller's admission check refused the frame (rate limit); its payload is
    /// skipped unread.
    #[error("Frame refused (rate limit)")]
    Refused {
        /// Its header.
        header: Header,
    },
    /// A frame other than HELLO with a version this crate does not know; payload skipped.
    #[error("Frame of version {version}")]
    BadVersion {
        /// The version.
        version: u16,
        /// Its header.
        header: Header,
    },
    /// Undefined frame type; payload skipped.
    #[error("Unknown frame type {ftype}")]
    UnknownType {
        /// The type.
        ftype: u16,
        /// Its header.
        header: Header,
    },
    /// Payload length wrong for the type; payload skipped.
    #[error("Payload of {len} bytes invalid for frame type {ftype}")]
    BadLength {
        /// The type.
        ftype: u16,
        /// Announced payload bytes.
        len: u32,
        /// Its header.
        header: Header,
    },
    /// A field of a well-sized payload is invalid (HINTS count not matching the length,
    /// unknown flag bits, non-zero reserved field).
    #[error("Invalid field {field} in frame type {ftype}")]
    BadField {
        /// The type.
        ftype: u16,
        /// Which field.
        field: &'static str,
        /// Its header.
        header: Header,
    },
}

impl DecodeError {
    /// A short stable name for counters and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Garbage { .. } => "garbage",
            Self::Oversize { .. } => "oversize",
            Self::Refused { .. } => "rate",
            Self::BadVersion { .. } => "bad_version",
            Self::UnknownType { .. } => "bad_type",
            Self::BadLength { .. } => "bad_length",
            Self::BadField { .. } => "bad_field",
        }
    }
}

/// Incremental frame decoder.
///
/// [`Decoder::feed`] copies bytes into a buffer of one maximal frame (allocated once, never
/// grown); [`Decoder::next_frame`] returns the next frame or error, or `None` when it needs
/// more bytes. Before a frame's payload is buffered, an admission callback sees its header
/// (the host's rate limit); a refused frame's payload is skipped without being copied.
pub struct Decoder {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Payload bytes still to discard (refused or invalid frame).
    skip: u64,
    /// Header of a frame admitted and waiting for its payload.
    admitted: Option<Header>,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("buffered", &self.buffered())
            .field("skip", &self.skip)
            .field("admitted", &self.admitted)
            .finish()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Offset of the first position in `b` where a magic starts, or where a tail of `b` is a
/// prefix of the magic (it may complete with the next bytes); `b.len()` if none.
fn magic_offset(b: &[u8]) -> usize {
    for i in 0..b.len() {
        let tail = &b[i..];
        let n = tail.len().min(MAGIC.len());
        if tail[..n] == MAGIC[..n] {
            return i;
        }
    }
    b.len()
}

impl Decoder {
    /// An empty decoder with its one-frame buffer.
    pub fn new() -> Self {
        Self {
            buf: vec![0u8; MAX_FRAME_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            skip: 0,
            admitted: None,
        }
    }

    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Bytes [`Decoder::feed`] can take now (refused payloads being skipped do not count
    /// against it: they are consumed without copying).
    pub fn space(&self) -> usize {
        self.buf.len() - self.buffered()
    }

    /// Forgets everything buffered (a new connection).
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.skip = 0;
        self.admitted = None;
    }

    /// Takes bytes from `input`: skipped payload bytes are consumed without copying, the
    /// rest copied while the buffer has room. Returns how many bytes of `input` were taken;
    /// the caller feeds the remainder after draining frames with [`Decoder::next_frame`].
    pub fn feed(&mut self, input: &[u8]) -> usize {
        let mut taken = 0usize;
        if self.skip > 0 && self.start == self.end {
            let n = usize::try_from(self.skip)
                .unwrap_or(usize::MAX)
                .min(input.len());
            self.skip -= n as u64;
            taken = n;
        }
        if self.skip > 0 {
            return taken;
        }
        let rest = &input[taken..];
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = rest.len().min(self.buf.len() - self.end);
        self.buf[self.end..self.end + n].copy_from_slice(&rest[..n]);
        self.end += n;
        taken + n
    }

    fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Drops the payload of the frame whose header was just consumed.
    fn skip_payload(&mut self, len: u32) {
        let have = self.buffered();
        let len = u64::from(len);
        let now = usize::try_from(len).unwrap_or(usize::MAX).min(have);
        self.consume(now);
        self.skip = len - now as u64;
    }

    /// The next frame or error from the buffered bytes, `None` if more bytes are needed.
    /// `admit` sees the header of every well-formed-length frame once, before its payload
    /// is buffered; returning `false` drops it ([`DecodeError::Refused`]).
    pub fn next_frame(
        &mut self,
        mut admit: impl FnMut(&Header) -> bool,
    ) -> Option<Result<Frame, DecodeError>> {
        if self.skip > 0 {
            let now = usize::try_from(self.skip)
                .unwrap_or(usize::MAX)
                .min(self.buffered());
            self.consume(now);
            self.skip -= now as u64;
            if self.skip > 0 {
                return None;
            }
        }
        let avail = &self.buf[self.start..self.end];
        let off = magic_offset(avail);
        if off > 0 {
            self.consume(off);
            return Some(Err(DecodeError::Garbage { bytes: off }));
        }
        let hb: &[u8; HEADER_BYTES] = avail.get(..HEADER_BYTES)?.try_into().ok()?;
        // The magic is at offset 0 (checked above), so parse cannot fail.
        let header = Header::parse(hb)?;
        if header.len as usize > MAX_PAYLOAD_BYTES {
            self.consume(HEADER_BYTES);
            return Some(Err(DecodeError::Oversize { len: header.len }));
        }
        if self.admitted.is_none() {
            if !admit(&header) {
                self.consume(HEADER_BYTES);
                self.skip_payload(header.len);
                return Some(Err(DecodeError::Refused { header }));
            }
            let err = match FrameType::from_u16(header.ftype) {
                None => Some(DecodeError::UnknownType {
                    ftype: header.ftype,
                    header,
                }),
                Some(t) if t != FrameType::Hello && header.version != VERSION => {
                    Some(DecodeError::BadVersion {
                        version: header.version,
                        header,
                    })
                }
                Some(t) if !t.payload_len_ok(header.len as usize) => Some(DecodeError::BadLength {
                    ftype: header.ftype,
                    len: header.len,
                    header,
                }),
                Some(_) => None,
            };
            if let Some(e) = err {
                self.consume(HEADER_BYTES);
                self.skip_payload(header.len);
                return Some(Err(e));
            }
            self.admitted = Some(header);
        }
        let total = HEADER_BYTES + header.len as usize;
        if self.start + total > self.end {
            return None;
        }
        let payload = self
            .buf
            .get(self.start + HEADER_BYTES..self.start + total)?;
        let res = parse_payload(&header, payload);
        self.admitted = None;
        self.consume(total);
        Some(res)
    }
}

/// Parses a payload whose type and length were checked.
fn parse_payload(h: &Header, payload: &[u8]) -> Result<Frame, DecodeError> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    let bad = |field| DecodeError::BadField {
        ftype: h.ftype,
        field,
        header: *h,
    };
    let body = match FrameType::from_u16(h.ftype) {
        Some(FrameType::Hello) => Body::Hello(Hello {
            min_version: r.u16(),
            max_version: r.u16(),
            features: r.u32(),
            name: r.array(),
        }),
        Some(FrameType::Welcome) => {
            let version = r.u16();
            if r.u16() != 0 {
                return Err(bad("reserved"));
            }
            Body::Welcome(Welcome {
                version,
                max_frame_bytes: r.u32(),
                max_ranges: r.u32(),
                frames_per_s: r.u32(),
                bytes_per_s: r.u32(),
            })
        }
        Some(FrameType::Hints) => {
            let epoch = r.u64();
            let count = r.u32();
            let flags = r.u32();
            let have = (payload.len().saturating_sub(HINTS_HEAD_BYTES)) / RANGE_BYTES;
            if count as usize != have {
                return Err(bad("count"));
            }
            if flags & !KNOWN_FLAGS != 0 {
                return Err(bad("flags"));
            }
            let mut ranges = Vec::with_capacity(have);
            for _ in 0..have {
                ranges.push(RawRange {
                    gpa: r.u64(),
                    len: r.u64(),
                    kind: r.u8(),
                    weight: r.u8(),
                    source: r.u8(),
                    reserved: r.array(),
                });
            }
            Body::Hints(Hints {
                epoch,
                flags,
                ranges,
            })
        }
        Some(FrameType::Ack) => {
            let a = Ack {
                acked_seq: r.u32(),
                accepted: r.u32(),
                rejected: r.u32(),
            };
            if r.u32() != 0 {
                return Err(bad("reserved"));
            }
            Body::Ack(a)
        }
        Some(FrameType::SlowDown) => Body::SlowDown(SlowDown {
            dropped: r.u32(),
            retry_after_ms: r.u32(),
        }),
        Some(FrameType::Bye) => Body::Bye(Bye { reason: r.u32() }),
        None => {
            return Err(DecodeError::UnknownType {
                ftype: h.ftype,
                header: *h,
            })
        }
    };
    Ok(Frame {
        version: h.version,
        seq: h.seq,
        body,
    })
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // Small constants and deliberate byte picks.
mod tests {
    use super::*;

    fn hello() -> Frame {
        Frame::new(0, Body::Hello(Hello::new(1, 1, "vmtier-agent")))
    }

    fn range(gpa: u64, len: u64, kind: u8) -> RawRange {
        RawRange {
            gpa,
            len,
            kind,
            weight: 10,
            source: 1,
            reserved: [0; 5],
        }
    }

    fn hints(seq: u32, n: usize) -> Frame {
        let ranges = (0..n as u64).map(|i| range(i * 4096, 4096, 1)).collect();
        Frame::new(
            seq,
            Body::Hints(Hints {
                epoch: 7,
                flags: FLAG_REPLACE,
                ranges,
            }),
        )
    }

    fn enc(f: &Frame) -> Vec<u8> {
        let mut v = Vec::new();
        f.encode(&mut v).unwrap();
        v
    }

    /// A raw header, for frames the encoder would not write.
    fn header(version: u16, ftype: u16, seq: u32, len: u32) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&ftype.to_le_bytes());
        v.extend_from_slice(&seq.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v
    }

    fn with_payload(mut h: Vec<u8>, p: &[u8]) -> Vec<u8> {
        h.extend_from_slice(p);
        h
    }

    /// Feeds `input` in chunks of `chunk` bytes and drains every result.
    fn decode_all(
        input: &[u8],
        chunk: usize,
        mut admit: impl FnMut(&Header) -> bool,
    ) -> Vec<Result<Frame, DecodeError>> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for mut c in input.chunks(chunk.max(1)) {
            while !c.is_empty() {
                let n = d.feed(c);
                c = &c[n..];
                while let Some(r) = d.next_frame(&mut admit) {
                    out.push(r);
                }
            }
        }
        while let Some(r) = d.next_frame(&mut admit) {
            out.push(r);
        }
        assert_eq!(d.buf.len(), MAX_FRAME_BYTES, "buffer never grows");
        out
    }

    /// Results as short names: `reason` for errors, the frame type for frames.
    fn names(rs: &[Result<Frame, DecodeError>]) -> Vec<String> {
        rs.iter()
            .map(|r| match r {
                Ok(f) => format!("{:?}", f.body.frame_type()),
                Err(DecodeError::Garbage { bytes }) => format!("garbage:{bytes}"),
                Err(e) => e.reason().to_string(),
            })
            .collect()
    }

    #[test]
    fn round_trip_every_frame_type() {
        let frames = [
            hello(),
            Frame::new(
                0,
                Body::Welcome(Welcome {
                    version: 1,
                    max_frame_bytes: MAX_FRAME_BYTES as u32,
                    max_ranges: MAX_RANGES_PER_FRAME as u32,
                    frames_per_s: DEFAULT_FRAMES_PER_S,
                    bytes_per_s: DEFAULT_BYTES_PER_S,
                }),
            ),
            hints(1, 1),
            hints(2, MAX_RANGES_PER_FRAME),
            Frame::new(
                3,
                Body::Ack(Ack {
                    acked_seq: 2,
                    accepted: 5,
                    rejected: 1,
                }),
            ),
            Frame::new(
                4,
                Body::SlowDown(SlowDown {
                    dropped: 9,
                    retry_after_ms: 1000,
                }),
            ),
            Frame::new(
                5,
                Body::Bye(Bye {
                    reason: bye::SHUTTING_DOWN,
                }),
            ),
            Frame::new(6, Body::Bye(Bye { reason: 77 })),
        ];
        for f in &frames {
            let bytes = enc(f);
            assert_eq!(bytes.len(), f.encoded_len());
            assert!(bytes.len() <= MAX_FRAME_BYTES);
            for chunk in [1, 7, 16, 4096, MAX_FRAME_BYTES] {
                let got = decode_all(&bytes, chunk, |_| true);
                assert_eq!(got, vec![Ok(f.clone())], "{f:?} in chunks of {chunk}");
            }
            let mut fixed = vec![0u8; f.encoded_len()];
            assert_eq!(f.encode_into(&mut fixed), Ok(bytes.len()));
            assert_eq!(fixed, bytes);
        }
    }

    #[test]
    fn header_layout_matches_the_spec() {
        let b = enc(&Frame::new(0x0102_0304, Body::Bye(Bye { reason: 1 })));
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), MAGIC_U32);
        assert_eq!(&b[4..16], &[1, 0, 6, 0, 4, 3, 2, 1, 4, 0, 0, 0]);
        assert_eq!(&b[16..], &[1, 0, 0, 0]);
        let h = enc(&hints(1, 1));
        assert_eq!(h.len(), HEADER_BYTES + HINTS_HEAD_BYTES + RANGE_BYTES);
        // Range: gpa 0, len 4096, kind 1, weight 10, source 1, reserved 0.
        assert_eq!(&h[32..40], &[0; 8]);
        assert_eq!(&h[40..48], &4096u64.to_le_bytes());
        assert_eq!(&h[48..56], &[1, 10, 1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn malformed_input_is_dropped_by_reason_and_the_stream_recovers() {
        let hel = enc(&hello());
        let mut too_many = enc(&hints(1, 1));
        // count field says 2, payload holds 1.
        too_many[HEADER_BYTES + 8..HEADER_BYTES + 12].copy_from_slice(&2u32.to_le_bytes());
        let mut bad_flags = enc(&hints(1, 1));
        bad_flags[HEADER_BYTES + 12] = 0b10;
        let mut bad_welcome = enc(&Frame::new(
            0,
            Body::Welcome(Welcome {
                version: 1,
                max_frame_bytes: 1,
                max_ranges: 1,
                frames_per_s: 1,
                bytes_per_s: 1,
            }),
        ));
        bad_welcome[HEADER_BYTES + 2] = 1;
        let mut bad_ack = enc(&Frame::new(
            0,
            Body::Ack(Ack {
                acked_seq: 1,
                accepted: 0,
                rejected: 0,
            }),
        ));
        bad_ack[HEADER_BYTES + 12] = 1;
        let mut hints_v2 = enc(&hints(1, 1));
        hints_v2[4] = 2;
        let mut hello_v9 = hel.clone();
        hello_v9[4] = 9;
        let over_max_ranges = (HINTS_HEAD_BYTES + RANGE_BYTES * (MAX_RANGES_PER_FRAME + 1)) as u32;
        let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
            ("empty", vec![], vec![]),
            ("truncated header", hel[..10].to_vec(), vec![]),
            ("truncated payload", hel[..hel.len() - 1].to_vec(), vec![]),
            (
                "garbage before",
                [b"xyz".as_slice(), &hel].concat(),
                vec!["garbage:3", "Hello"],
            ),
            (
                "broken magic",
                [b"VMTX".as_slice(), &hel].concat(),
                vec!["garbage:4", "Hello"],
            ),
            (
                "magic prefix at the end",
                b"abcVMT".to_vec(),
                vec!["garbage:3"],
            ),
            (
                "oversize then its body as garbage",
                [
                    header(1, 3, 1, MAX_PAYLOAD_BYTES as u32 + 1),
                    vec![0xAA; 5],
                    hel.clone(),
                ]
                .concat(),
                vec!["oversize", "garbage:5", "Hello"],
            ),
            (
                "length u32::MAX",
                [header(1, 3, 1, u32::MAX), hel.clone()].concat(),
                vec!["oversize", "Hello"],
            ),
            (
                "unknown type",
                [with_payload(header(1, 7, 1, 3), b"abc"), hel.clone()].concat(),
                vec!["bad_type", "Hello"],
            ),
            (
                "type zero",
                [header(1, 0, 1, 0), hel.clone()].concat(),
                vec!["bad_type", "Hello"],
            ),
            (
                "hints of version 2",
                [hints_v2, hel.clone()].concat(),
                vec!["bad_version", "Hello"],
            ),
            (
                "hints of version 0",
                {
                    let mut h = enc(&hints(1, 1));
                    h[4] = 0;
                    [h, hel.clone()].concat()
                },
                vec!["bad_version", "Hello"],
            ),
            ("hello of any version is read", hello_v9, vec!["Hello"]),
            (
                "hello too short",
                [with_payload(header(1, 1, 0, 39), &[0; 39]), hel.clone()].concat(),
                vec!["bad_length", "Hello"],
            ),
            (
                "ack empty",
                [header(1, 4, 0, 0), hel.clone()].concat(),
                vec!["bad_length", "Hello"],
            ),
            (
                "hints with no range",
                [with_payload(header(1, 3, 1, 16), &[0; 16]), hel.clone()].concat(),
                vec!["bad_length", "Hello"],
            ),
            (
                "hints with a partial range",
                [with_payload(header(1, 3, 1, 39), &[0; 39]), hel.clone()].concat(),
                vec!["bad_length", "Hello"],
            ),
            (
                "hints with 2049 ranges",
                [
                    with_payload(
                        header(1, 3, 1, over_max_ranges),
                        &vec![0; over_max_ranges as usize],
                    ),
                    hel.clone(),
                ]
                .concat(),
                vec!["bad_length", "Hello"],
            ),
            (
                "hints count mismatch",
                [too_many, hel.clone()].concat(),
                vec!["bad_field", "Hello"],
            ),
            (
                "hints unknown flag",
                [bad_flags, hel.clone()].concat(),
                vec!["bad_field", "Hello"],
            ),
            (
                "welcome reserved",
                [bad_welcome, hel.clone()].concat(),
                vec!["bad_field", "Hello"],
            ),
            (
                "ack reserved",
                [bad_ack, hel.clone()].concat(),
                vec!["bad_field", "Hello"],
            ),
            (
                "magic inside a payload is not a frame",
                {
                    let mut h = enc(&hints(1, 1));
                    h[HEADER_BYTES + 24..HEADER_BYTES + 28].copy_from_slice(&MAGIC);
                    [h, hel.clone()].concat()
                },
                vec!["Hints", "Hello"],
            ),
        ];
        for (name, input, want) in cases {
            for chunk in [1, 3, 17, 1 << 20] {
                let got = decode_all(&input, chunk, |_| true);
                // Garbage may be reported in several pieces when fed byte by byte; sum them.
                let mut merged: Vec<String> = Vec::new();
                let mut garbage = 0usize;
                for n in names(&got) {
                    if let Some(b) = n.strip_prefix("garbage:") {
                        garbage += b.parse::<usize>().unwrap();
                        continue;
                    }
                    if garbage > 0 {
                        merged.push(format!("garbage:{garbage}"));
                        garbage = 0;
                    }
                    merged.push(n);
                }
                if garbage > 0 {
                    merged.push(format!("garbage:{garbage}"));
                }
                assert_eq!(merged, want, "{name}, chunks of {chunk}");
            }
        }
    }

    #[test]
    fn refused_frames_are_skipped_unread() {
        let big = enc(&hints(1, MAX_RANGES_PER_FRAME));
        let input = [big.clone(), enc(&hints(2, 3)), enc(&hello())].concat();
        for chunk in [1, 100, 65536] {
            let got = decode_all(&input, chunk, |h| h.seq != 1);
            assert_eq!(names(&got), ["rate", "Hints", "Hello"], "chunks of {chunk}");
            // A refused frame's header is seen once; the admitted one once too.
            let mut seen = Vec::new();
            decode_all(&input, chunk, |h| {
                seen.push(h.seq);
                h.seq != 1
            });
            assert_eq!(seen, [1, 2, 0]);
        }
    }

    #[test]
    fn random_bytes_never_panic_and_the_stream_resyncs() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = Vec::new();
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Salt the noise with magics so that headers with random fields appear.
            if x % 97 == 0 {
                noise.extend_from_slice(&MAGIC);
            }
            noise.push(x as u8);
        }
        let got = decode_all(&noise, 4093, |_| true);
        assert!(!got.is_empty());
        // After the noise, enough zero bytes to finish any payload being skipped, then a frame.
        let input = [noise, vec![0; MAX_FRAME_BYTES], enc(&hello())].concat();
        let got = decode_all(&input, 4093, |_| true);
        assert_eq!(got.last(), Some(&Ok(hello())));
    }

    #[test]
    fn feed_takes_at_most_one_frame_of_bytes() {
        let mut d = Decoder::new();
        let junk = vec![b'x'; 3 * MAX_FRAME_BYTES];
        assert_eq!(d.feed(&junk), MAX_FRAME_BYTES);
        assert_eq!(d.space(), 0);
        assert_eq!(d.feed(&junk), 0);
        assert_eq!(
            d.next_frame(|_| true),
            Some(Err(DecodeError::Garbage {
                bytes: MAX_FRAME_BYTES
            }))
        );
        assert_eq!(d.next_frame(|_| true), None);
        assert_eq!(d.space(), MAX_FRAME_BYTES);
        d.feed(&enc(&hello())[..5]);
        d.reset();
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn range_rules() {
        let ok = range(1 << 30, 2 << 20, 1);
        let cases: Vec<(&str, RawRange, Result<HintKind, RangeError>)> = vec![
            ("good", ok, Ok(HintKind::Hot)),
            ("pinned", RawRange { kind: 4, ..ok }, Ok(HintKind::Pinned)),
            (
                "free",
                RawRange {
                    kind: 3,
                    source: 3,
                    ..ok
                },
                Ok(HintKind::Free),
            ),
            (
                "max weight",
                RawRange {
                    weight: 255,
                    kind: 2,
                    ..ok
                },
                Ok(HintKind::Cold),
            ),
            (
                "gpa unaligned",
                RawRange { gpa: 4097, ..ok },
                Err(RangeError::Unaligned),
            ),
            (
                "len unaligned",
                RawRange { len: 100, ..ok },
                Err(RangeError::Unaligned),
            ),
            ("empty", RawRange { len: 0, ..ok }, Err(RangeError::Empty)),
            (
                "wraps",
                RawRange {
                    gpa: u64::MAX - 4095,
                    len: 8192,
                    ..ok
                },
                Err(RangeError::Overflow),
            ),
            (
                "ends at 2^64",
                RawRange {
                    gpa: u64::MAX - 4095,
                    len: 4096,
                    ..ok
                },
                Err(RangeError::Overflow),
            ),
            (
                "kind 0",
                RawRange { kind: 0, ..ok },
                Err(RangeError::BadKind(0)),
            ),
            (
                "kind 5",
                RawRange { kind: 5, ..ok },
                Err(RangeError::BadKind(5)),
            ),
            (
                "weight 0",
                RawRange { weight: 0, ..ok },
                Err(RangeError::BadWeight),
            ),
            (
                "source 0",
                RawRange { source: 0, ..ok },
                Err(RangeError::BadSource(0)),
            ),
            (
                "source 6",
                RawRange { source: 6, ..ok },
                Err(RangeError::BadSource(6)),
            ),
            (
                "reserved",
                RawRange {
                    reserved: [0, 0, 0, 0, 1],
                    ..ok
                },
                Err(RangeError::Reserved),
            ),
        ];
        for (name, r, want) in cases {
            let got = r.check().map(|h| h.kind);
            assert_eq!(got, want, "{name}");
            if let Ok(h) = r.check() {
                assert_eq!(h.to_raw(), r, "{name}");
                assert_eq!(h.end(), r.gpa + r.len);
            }
        }
    }

    #[test]
    fn encode_errors() {
        let none = Frame::new(
            1,
            Body::Hints(Hints {
                epoch: 0,
                flags: 0,
                ranges: vec![],
            }),
        );
        let mut v = vec![1u8];
        assert_eq!(none.encode(&mut v), Err(EncodeError::RangeCount(0)));
        assert_eq!(v, [1], "nothing appended on error");
        let many = hints(1, MAX_RANGES_PER_FRAME + 1);
        assert_eq!(many.encode(&mut v), Err(EncodeError::RangeCount(2049)));
        let mut small = [0u8; 20];
        assert_eq!(
            hello().encode_into(&mut small),
            Err(EncodeError::BufferTooSmall { need: 56, have: 20 })
        );
    }

    #[test]
    fn version_negotiation() {
        let cases = [
            ((1, 1), Some(1)),
            ((1, 5), Some(1)),
            ((0, 1), Some(1)),
            ((2, 3), None),
            ((0, 0), None),
            ((3, 1), None),
        ];
        for ((lo, hi), want) in cases {
            let h = Hello::new(lo, hi, "x");
            assert_eq!(
                h.negotiate(HOST_MIN_VERSION, HOST_MAX_VERSION),
                want,
                "{lo}..={hi}"
            );
        }
    }

    #[test]
    fn agent_names() {
        let cases = [
            ("vmtier-agent", "vmtier-agent"),
            ("a\u{1b}[2Jb", "a?[2Jb"),
            (
                "0123456789abcdef0123456789abcdefXYZ",
                "0123456789abcdef0123456789abcdef",
            ),
            ("ééééééééééééééééé", "????????????????????????????????"),
        ];
        for (name, want) in cases {
            assert_eq!(Hello::new(1, 1, name).name_lossy(), want, "{name}");
        }
    }

    #[test]
    fn frame_type_table() {
        for v in 0u16..10 {
            let t = FrameType::from_u16(v);
            assert_eq!(t.is_some(), (1..=6).contains(&v));
            if let Some(t) = t {
                assert_eq!(t as u16, v);
            }
        }
        assert!(FrameType::Hints.payload_len_ok(HINTS_HEAD_BYTES + RANGE_BYTES));
        assert!(
            FrameType::Hints.payload_len_ok(HINTS_HEAD_BYTES + RANGE_BYTES * MAX_RANGES_PER_FRAME)
        );
        assert!(!FrameType::Hints.payload_len_ok(0));
        assert_eq!(MAX_FRAME_BYTES, 65536);
        assert_eq!(u32::from_le_bytes(MAGIC), MAGIC_U32);
    }
}
