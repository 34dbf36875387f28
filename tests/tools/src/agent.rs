//! The guest agent end to end: the tiered host is the agent's guest.
//!
//! - `agent-guest` (inside the tiered host): starts `vmtier-agent` on the virtio-serial port
//!   the runner added (`--agent-port`), maps three known buffers (mlocked: 8 MiB marked HOT
//!   and 1 MiB marked PINNED through the agent's app socket, 2 MiB of memfd matched by a
//!   `[[process]]` COLD rule), asks the agent for a snapshot (`sync`) and writes the
//!   buffers' frame numbers (its own pagemap) and MemFree around the snapshot to
//!   `$VMTIER_RUN/agent-guest.json`.
//! - `agent-host` (on the machine, outside): runs the testbed command, plays the host end
//!   of the channel with the protocol crate's decoder (HELLO → WELCOME, HINTS → ACK),
//!   records every frame, then checks them against that file: the HOT/PINNED/COLD ranges
//!   name exactly the buffers' guest-physical pages, FREE ranges never touch them and add
//!   up to MemFree within a tolerance, every frame decodes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use vmtier_hint_proto::{
    Ack, Body, Decoder, Frame, HintKind, HintSource, Welcome, DEFAULT_BYTES_PER_S,
    DEFAULT_FRAMES_PER_S, FLAG_REPLACE, MAX_FRAME_BYTES, MAX_RANGES_PER_FRAME,
};

use crate::check::Checks;

const PAGE: u64 = 4096;
const SOCK: &str = "/run/vmtier-agent.sock";
const COLD_MEMFD: &str = "vmtier-agent-cold";

/// `tbcheck agent-guest`.
#[derive(Args, Debug)]
pub struct GuestArgs {
    /// The agent binary (the static build).
    #[arg(long)]
    agent: PathBuf,
    /// Bytes of the buffer marked HOT, MiB.
    #[arg(long, default_value_t = 8)]
    hot_mib: u64,
    /// Seconds to keep writing the hot buffer after the snapshot (for the guest's DAMON).
    #[arg(long, default_value_t = 8)]
    touch_secs: u64,
}

/// `tbcheck agent-host`.
#[derive(Args, Debug)]
pub struct HostArgs {
    /// The chardev socket QEMU listens on (the runner's `--agent-port`).
    #[arg(long)]
    socket: PathBuf,
    /// Allowed |FREE total − MemFree|, permille of MemFree.
    #[arg(long, default_value_t = 10)]
    free_tolerance_permille: u64,
    /// The testbed command (tests/testbed/run ... -- tbcheck agent-guest ...).
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// An mlocked anonymous or memfd buffer, unmapped on drop.
struct Buf {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Buf {
    fn anon(len: usize) -> std::io::Result<Self> {
        Self::finish(crate::mem::map_anon(len, None)?, len)
    }

    fn memfd(name: &str, len: usize) -> std::io::Result<Self> {
        let cname = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
        // SAFETY: cname is a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let size = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
        // SAFETY: fd is the memfd just created; the results are checked.
        let ptr = unsafe {
            if libc::ftruncate(fd, size) != 0 {
                libc::close(fd);
                return Err(std::io::Error::last_os_error());
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            p
        };
        Self::finish(ptr, len)
    }

    fn finish(ptr: *mut libc::c_void, len: usize) -> std::io::Result<Self> {
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let b = Self { ptr, len };
        // SAFETY: ptr..ptr+len is the mapping made above, writable.
        unsafe {
            for off in (0..len).step_by(4096) {
                ptr.cast::<u8>().add(off).write_volatile(0x5a);
            }
            if libc::mlock(ptr, len) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(b)
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `anon`/`memfd`, not used afterwards.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Frame numbers of `[addr, addr+len)` in this process (present pages).
fn own_pfns(addr: u64, len: u64) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open("/proc/self/pagemap")?;
    let pages = usize::try_from(len / PAGE).map_err(std::io::Error::other)?;
    let mut buf = vec![0u8; pages * 8];
    f.read_exact_at(&mut buf, addr / PAGE * 8)?;
    Ok(buf
        .chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().unwrap_or([0; 8])))
        .filter(|v| v >> 63 == 1)
        .map(|v| v & ((1 << 55) - 1))
        .collect())
}

fn mem_free_kib() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemFree:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn ask(s: &mut UnixStream, r: &mut BufReader<UnixStream>, req: &Value) -> std::io::Result<Value> {
    writeln!(s, "{req}")?;
    let mut line = String::new();
    r.read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// `agent-guest`: runs inside the tiered host.
pub fn guest(c: &mut Checks, a: &GuestArgs) {
    let run = PathBuf::from(std::env::var("VMTIER_RUN").unwrap_or_else(|_| "/tmp".into()));
    // The agent sees no PMU under TCG and says so; the port must be there.
    match Command::new(&a.agent).arg("--check").output() {
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            print!("{out}");
            c.check(
                out.lines().any(|l| l.starts_with("port: /dev/vport")),
                "agent --check finds the virtio-serial port",
                out.lines().next().unwrap_or(""),
            );
            let pmu = out.lines().find(|l| l.starts_with("pmu: ")).unwrap_or("");
            let tcg = std::env::var("VMTIER_ACCEL").as_deref() == Ok("tcg");
            c.check(
                !tcg || pmu.starts_with("pmu: unavailable: "),
                "agent --check reports the PMU source unavailable under TCG, with a reason",
                pmu,
            );
        }
        Err(e) => return c.fatal("run agent --check", e),
    }
    // --print: one snapshot encoded and decoded back, nothing sent.
    match Command::new(&a.agent).arg("--print").output() {
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            let totals: Vec<&str> = out.lines().filter(|l| l.starts_with("total ")).collect();
            c.check(
                o.status.success() && totals.iter().any(|l| l.starts_with("total FREE")),
                "agent --print decodes its own frames",
                totals.join("; "),
            );
        }
        Err(e) => return c.fatal("run agent --print", e),
    }
    // --once: one snapshot to the host, then BYE.
    match Command::new(&a.agent)
        .args(["--once", "--timeout-ms", "60000"])
        .output()
    {
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            print!("{out}");
            c.check(
                o.status.success() && out.contains("host accepted"),
                "agent --once sends one snapshot and exits 0",
                out.lines().last().unwrap_or(""),
            );
        }
        Err(e) => return c.fatal("run agent --once", e),
    }
    let cfg = run.join("agent.toml");
    let me = std::process::id();
    let text = format!(
        "[agent]\ninterval_ms = 1500\n\n[app]\nsocket = \"{SOCK}\"\n\n\
         [[process]]\npid = {me}\nkind = \"cold\"\nmappings = [\"/memfd:{COLD_MEMFD} (deleted)\"]\nweight = 100\n"
    );
    if let Err(e) = fs::write(&cfg, text) {
        return c.fatal("write the agent configuration", e);
    }
    let log = match fs::File::create(run.join("agent.log")) {
        Ok(f) => f,
        Err(e) => return c.fatal("create agent.log", e),
    };
    let mut agent = match Command::new(&a.agent)
        .args(["-c".as_ref(), cfg.as_os_str()])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
    {
        Ok(ch) => ch,
        Err(e) => return c.fatal("start the agent", e),
    };
    let result = guest_session(c, a, &run);
    // SAFETY: kill on the agent's pid (our child, not yet reaped) with SIGTERM.
    unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
    match agent.wait() {
        Ok(st) => {
            c.check(st.success(), "the agent stops cleanly on SIGTERM", st);
        }
        Err(e) => c.fatal("wait for the agent", e),
    }
    c.check(
        !Path::new(SOCK).exists(),
        "the agent removed its socket",
        SOCK,
    );
    if let Err(e) = result {
        c.fatal("agent-guest", e);
    }
}

fn guest_session(c: &mut Checks, a: &GuestArgs, run: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    while !Path::new(SOCK).exists() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(format!("no {SOCK} after 60 s (see agent.log)"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mode = fs::metadata(SOCK)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777);
    c.check(
        mode.as_ref().is_ok_and(|m| *m == 0o660),
        "the app socket has mode 0660",
        format!("{mode:?}"),
    );
    let hot = Buf::anon(usize::try_from(a.hot_mib << 20).unwrap_or(8 << 20))
        .map_err(|e| format!("hot buffer: {e}"))?;
    let pinned = Buf::anon(1 << 20).map_err(|e| format!("pinned buffer: {e}"))?;
    let cold = Buf::memfd(COLD_MEMFD, 2 << 20).map_err(|e| format!("memfd buffer: {e}"))?;
    // A thread keeps writing the hot buffer so the guest's DAMON sees it hot.
    let stop = AtomicBool::new(false);
    let (addr, len) = (hot.addr(), hot.len);
    let r = std::thread::scope(|sc| {
        sc.spawn(|| touch(addr, len, &stop));
        let r = marked(c, a, run, &hot, &pinned, &cold);
        stop.store(true, Ordering::Relaxed);
        r
    });
    drop((hot, pinned, cold));
    r
}

/// Writes one byte per page of `[addr, addr+len)` over and over until `stop`. Each pass
/// starts with an mprotect round trip: DAMON clears accessed bits without a TLB flush, and
/// a CPU that keeps the translation cached (TCG's softmmu TLB too) would not set them again.
fn touch(addr: u64, len: usize, stop: &AtomicBool) {
    let mut round = 0u8;
    while !stop.load(Ordering::Relaxed) {
        round = round.wrapping_add(1);
        // SAFETY: the mapping stays alive until this thread ends (scoped); protections only.
        unsafe {
            libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_READ);
            libc::mprotect(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            );
        }
        for off in (0..len).step_by(4096) {
            // SAFETY: the caller keeps the mapping alive until this thread ends (scoped).
            unsafe { (addr as *mut u8).add(off).write_volatile(round) };
        }
    }
}

fn marked(
    c: &mut Checks,
    a: &GuestArgs,
    run: &Path,
    hot: &Buf,
    pinned: &Buf,
    cold: &Buf,
) -> Result<(), String> {
    let mut s = UnixStream::connect(SOCK).map_err(|e| format!("connect {SOCK}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let mut q = |v: Value| ask(&mut s, &mut r, &v).map_err(|e| format!("app socket: {e}"));
    let v = q(json!({"op":"mark","addr":hot.addr(),"len":hot.len,"kind":"hot"}))?;
    c.check(
        v["ok"] == true && v["pages"] == json!(hot.len / 4096),
        "mark HOT through the app socket: every page resident",
        &v,
    );
    let v =
        q(json!({"op":"mark","addr":pinned.addr(),"len":pinned.len,"kind":"pinned","weight":250}))?;
    c.check(v["ok"] == true, "mark PINNED through the app socket", &v);
    // Bad requests are refused and change nothing.
    for bad in [
        json!({"op":"mark","addr":hot.addr() + 1,"len":4096,"kind":"hot"}),
        json!({"op":"mark","addr":hot.addr(),"len":4096,"kind":"free"}),
        json!({"op":"mark","addr":hot.addr(),"len":4096,"kind":"hot","gpa":0}),
        json!({"op":"mark","addr":u64::MAX - 4095,"len":8192,"kind":"hot"}),
    ] {
        let v = q(bad.clone())?;
        c.check(
            v["ok"] == false && v["error"].is_string(),
            "a bad request is refused",
            format!("{bad} -> {v}"),
        );
    }
    // Wait until the agent has a session with the host; the host end drops the first one
    // right away (agent-host), so wait a little and for a session again.
    for round in 0..2 {
        let t0 = Instant::now();
        loop {
            let v = q(json!({"op":"sync"}))?;
            if v["connected"] == true {
                break;
            }
            if t0.elapsed() > Duration::from_secs(90) {
                return Err(format!(
                    "the agent has no session with the host after 90 s: {v}"
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if round == 0 {
            std::thread::sleep(Duration::from_secs(4));
        }
    }
    let pfns = |b: &Buf| own_pfns(b.addr(), b.len as u64).map_err(|e| format!("pagemap: {e}"));
    let before = (pfns(hot)?, pfns(pinned)?, pfns(cold)?);
    let free_before = mem_free_kib();
    let v = q(json!({"op":"sync"}))?;
    let free_after = mem_free_kib();
    let after = (pfns(hot)?, pfns(pinned)?, pfns(cold)?);
    c.check(
        before == after,
        "the buffers did not move during the snapshot",
        "",
    );
    c.check(
        v["ok"] == true && v["frames"].as_u64().is_some_and(|f| f > 0),
        "sync queued a snapshot",
        &v,
    );
    let out = json!({
        "epoch": v["epoch"],
        "memfree_kib_before": free_before,
        "memfree_kib_after": free_after,
        "hot_pfns": after.0,
        "pinned_pfns": after.1,
        "cold_pfns": after.2,
    });
    fs::write(run.join("agent-guest.json"), out.to_string()).map_err(|e| e.to_string())?;
    println!(
        "agent-guest: epoch {} hot {} pages, pinned {} pages, cold {} pages, MemFree {free_before} -> {free_after} KiB",
        v["epoch"],
        after.0.len(),
        after.1.len(),
        after.2.len()
    );
    // Let the snapshot's frames leave (rate-limited) and DAMON find the hot buffer.
    std::thread::sleep(Duration::from_secs(a.touch_secs));
    let v = q(json!({"op":"list"}))?;
    c.check(
        v["marks"].as_array().is_some_and(|m| m.len() == 2),
        "list shows the two marks",
        &v,
    );
    Ok(())
}

/// One HINTS frame as received.
#[derive(Debug)]
struct Got {
    /// Sessions (HELLOs) seen before this frame.
    session: usize,
    epoch: u64,
    flags: u32,
    ranges: Vec<vmtier_hint_proto::HintRange>,
}

#[derive(Debug, Default)]
struct Wire {
    hellos: Vec<(u32, String)>,
    hints: Vec<Got>,
    byes: Vec<u32>,
    decode_errors: Vec<String>,
    bad_ranges: usize,
    seq_errors: usize,
    bytes: u64,
}

/// Plays the host end until the socket closes (QEMU exits).
/// When to hang up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Until {
    /// After the first BYE.
    Bye,
    /// After the first HINTS frame (a vmtierd restart in mid-session).
    Hints,
    /// At EOF (QEMU exits).
    Eof,
}

/// Plays the host end on one connection until `until`. Returns whether it got there
/// (false: EOF first).
fn host_end(mut s: UnixStream, w: &Arc<Mutex<Wire>>, until: Until) -> bool {
    let mut d = Decoder::new();
    let mut buf = vec![0u8; 65536];
    let mut last_seq: Option<u32> = None;
    let mut my_seq = 0u32;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
        w.bytes += n as u64;
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let k = d.feed(rest);
            rest = &rest[k..];
            while let Some(r) = d.next_frame(|_| true) {
                let f = match r {
                    Ok(f) => f,
                    Err(e) => {
                        w.decode_errors.push(e.to_string());
                        continue;
                    }
                };
                let reply = match &f.body {
                    Body::Hello(h) => {
                        last_seq = Some(f.seq);
                        w.hellos.push((f.seq, h.name_lossy()));
                        Some(Body::Welcome(Welcome {
                            version: 1,
                            max_frame_bytes: u32::try_from(MAX_FRAME_BYTES).unwrap_or(65536),
                            max_ranges: u32::try_from(MAX_RANGES_PER_FRAME).unwrap_or(2048),
                            frames_per_s: DEFAULT_FRAMES_PER_S,
                            bytes_per_s: DEFAULT_BYTES_PER_S,
                        }))
                    }
                    Body::Hints(h) => {
                        if last_seq.map_or(true, |l| f.seq <= l) {
                            w.seq_errors += 1;
                        }
                        last_seq = Some(f.seq);
                        let mut ok = Vec::new();
                        for r in &h.ranges {
                            match r.check() {
                                Ok(x) => ok.push(x),
                                Err(_) => w.bad_ranges += 1,
                            }
                        }
                        let rejected = h.ranges.len() - ok.len();
                        let accepted = ok.len();
                        let session = w.hellos.len();
                        w.hints.push(Got {
                            session,
                            epoch: h.epoch,
                            flags: h.flags,
                            ranges: ok,
                        });
                        if until == Until::Hints {
                            return true;
                        }
                        Some(Body::Ack(Ack {
                            acked_seq: f.seq,
                            accepted: u32::try_from(accepted).unwrap_or(u32::MAX),
                            rejected: u32::try_from(rejected).unwrap_or(u32::MAX),
                        }))
                    }
                    Body::Bye(b) => {
                        w.byes.push(b.reason);
                        if until == Until::Bye {
                            return true;
                        }
                        None
                    }
                    other => {
                        w.decode_errors
                            .push(format!("unexpected {:?}", other.frame_type()));
                        None
                    }
                };
                if let Some(body) = reply {
                    my_seq += 1;
                    let mut out = Vec::new();
                    if Frame::new(my_seq, body).encode(&mut out).is_ok() {
                        let _ = s.write_all(&out);
                    }
                }
            }
            if k == 0 {
                break;
            }
        }
    }
}

fn pages_of(ranges: &[&vmtier_hint_proto::HintRange]) -> BTreeSet<u64> {
    let mut s = BTreeSet::new();
    for r in ranges {
        for p in r.gpa / PAGE..(r.gpa + r.len) / PAGE {
            s.insert(p);
        }
    }
    s
}

fn pfn_set(v: &Value) -> BTreeSet<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// `agent-host`: runs on the machine.
pub fn host(c: &mut Checks, a: &HostArgs) {
    let _ = fs::remove_file(&a.socket);
    let mut child = match Command::new(&a.cmd[0])
        .args(&a.cmd[1..])
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(ch) => ch,
        Err(e) => return c.fatal("start the testbed", e),
    };
    // The runner names its run directory on stderr; pass everything through.
    let run_dir = Arc::new(Mutex::new(None::<PathBuf>));
    let stderr = child.stderr.take();
    let rd = Arc::clone(&run_dir);
    let err_thread = std::thread::spawn(move || {
        let Some(e) = stderr else { return };
        for line in BufReader::new(e).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Some(i) = line.find("; run ") {
                let p = line[i + 6..].trim_end_matches(')').to_owned();
                *rd.lock().unwrap_or_else(|p| p.into_inner()) = Some(PathBuf::from(p));
            }
        }
    });
    let wire = Arc::new(Mutex::new(Wire::default()));
    let t0 = Instant::now();
    let mut conn = None;
    while t0.elapsed() < Duration::from_secs(60) {
        if let Ok(s) = UnixStream::connect(&a.socket) {
            conn = Some(s);
            break;
        }
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(s) = conn else {
        let _ = child.kill();
        let _ = child.wait();
        return c.fatal("connect to the agent port socket", a.socket.display());
    };
    let w2 = Arc::clone(&wire);
    let sock = a.socket.clone();
    let reader = std::thread::spawn(move || {
        // Connection 1 until --once's BYE; connection 2 until the daemon agent's first
        // HINTS frame (hung up mid-session, as a restarting vmtierd would); connection 3
        // until QEMU exits. The agent must say HELLO again on each.
        if !host_end(s, &w2, Until::Bye) {
            return 1;
        }
        let mut n = 1;
        for until in [Until::Hints, Until::Eof] {
            let t = Instant::now();
            let conn = loop {
                std::thread::sleep(Duration::from_millis(if until == Until::Eof {
                    1000
                } else {
                    100
                }));
                if let Ok(s2) = UnixStream::connect(&sock) {
                    break Some(s2);
                }
                if t.elapsed() > Duration::from_secs(30) {
                    break None;
                }
            };
            let Some(s2) = conn else { return n };
            n += 1;
            if !host_end(s2, &w2, until) {
                return n;
            }
        }
        n
    });
    let status = child.wait();
    let connections = reader.join().unwrap_or(0);
    let _ = err_thread.join();
    let _ = fs::remove_file(&a.socket);
    match status {
        Ok(st) => {
            c.check(st.success(), "the testbed command succeeded", st);
        }
        Err(e) => return c.fatal("wait for the testbed", e),
    }
    let Some(dir) = run_dir.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
        return c.fatal(
            "find the run directory",
            "no '; run DIR)' line from the runner",
        );
    };
    let g: Value =
        match fs::read_to_string(dir.join("agent-guest.json")).map(|t| serde_json::from_str(&t)) {
            Ok(Ok(v)) => v,
            other => return c.fatal("read agent-guest.json", format!("{other:?}")),
        };
    let w = wire.lock().unwrap_or_else(|p| p.into_inner());
    c.check(
        w.hellos
            .iter()
            .all(|(seq, n)| *seq == 0 && n == "vmtier-agent"),
        "the agent said HELLO (seq 0, its name) in each session",
        format!("{:?}", w.hellos),
    );
    c.check(
        w.decode_errors.is_empty() && w.bad_ranges == 0 && w.seq_errors == 0,
        "every frame decoded, every range valid, seq strictly increasing",
        format!(
            "{} HINTS frames, {} bytes; decode errors {:?}, bad ranges {}, seq errors {}",
            w.hints.len(),
            w.bytes,
            w.decode_errors,
            w.bad_ranges,
            w.seq_errors
        ),
    );
    c.check(
        w.hints
            .windows(2)
            .all(|p| p[0].session != p[1].session || p[0].epoch <= p[1].epoch),
        "epochs never decrease within a session",
        "",
    );
    c.check(
        w.byes == [0, 0],
        "BYE (normal) after --once and when the daemon stopped",
        format!("{:?}", w.byes),
    );
    let once: Vec<&Got> = w.hints.iter().filter(|h| h.session == 1).collect();
    c.check(
        connections == 3 && w.hellos.len() == 3,
        "the host end hung up after --once and in the daemon's first session: the agent said HELLO on each new connection",
        format!("{connections} connections"),
    );
    c.check(
        once.iter()
            .any(|h| h.ranges.iter().any(|r| r.kind == HintKind::Free)),
        "--once: a session with one snapshot (FREE ranges), then the daemon's own session",
        format!(
            "{} sessions; --once sent {} frames",
            w.hellos.len(),
            once.len()
        ),
    );
    let Some(epoch) = g["epoch"].as_u64() else {
        return c.fatal("epoch in agent-guest.json", &g);
    };
    // The daemon agent's sessions (2 and 3) share its epoch counter.
    let frames: Vec<&Got> = w
        .hints
        .iter()
        .filter(|h| h.session >= 2 && h.epoch == epoch)
        .collect();
    let of = |src: HintSource, kind: HintKind| -> Vec<&vmtier_hint_proto::HintRange> {
        frames
            .iter()
            .flat_map(|f| f.ranges.iter())
            .filter(|r| r.source == src && r.kind == kind)
            .collect()
    };
    let want_hot = pfn_set(&g["hot_pfns"]);
    let want_pinned = pfn_set(&g["pinned_pfns"]);
    let want_cold = pfn_set(&g["cold_pfns"]);
    let hot = of(HintSource::App, HintKind::Hot);
    let got_hot = pages_of(&hot);
    c.check(
        !want_hot.is_empty() && got_hot == want_hot,
        "HOT ranges (app) name exactly the hot buffer's guest-physical pages",
        format!(
            "epoch {epoch}: {} ranges, {} pages; buffer {} pages, {} missing, {} extra",
            hot.len(),
            got_hot.len(),
            want_hot.len(),
            want_hot.difference(&got_hot).count(),
            got_hot.difference(&want_hot).count()
        ),
    );
    let pinned = of(HintSource::App, HintKind::Pinned);
    c.check(
        !want_pinned.is_empty()
            && pages_of(&pinned) == want_pinned
            && pinned.iter().all(|r| r.weight == 250),
        "PINNED ranges (app, weight 250) name exactly the pinned buffer's pages",
        format!("{} ranges, {} pages", pinned.len(), want_pinned.len()),
    );
    let cold = of(HintSource::Process, HintKind::Cold);
    c.check(
        !want_cold.is_empty() && pages_of(&cold) == want_cold,
        "COLD ranges (process rule on the memfd mapping) name exactly its pages",
        format!("{} ranges, {} pages", cold.len(), want_cold.len()),
    );
    let free = of(HintSource::FreePages, HintKind::Free);
    let free_pages = pages_of(&free);
    let touched: Vec<u64> = want_hot
        .iter()
        .chain(&want_pinned)
        .chain(&want_cold)
        .filter(|p| free_pages.contains(p))
        .copied()
        .collect();
    c.check(
        !free.is_empty() && touched.is_empty(),
        "FREE ranges never overlap the buffers",
        format!(
            "{} FREE ranges; {} buffer pages inside them",
            free.len(),
            touched.len()
        ),
    );
    let free_frames: Vec<&&Got> = frames
        .iter()
        .filter(|f| {
            f.ranges
                .first()
                .is_some_and(|r| r.source == HintSource::FreePages)
        })
        .collect();
    c.check(
        free_frames
            .first()
            .is_some_and(|f| f.flags & FLAG_REPLACE != 0)
            && free_frames
                .iter()
                .skip(1)
                .all(|f| f.flags & FLAG_REPLACE == 0),
        "the first FREE frame of the snapshot replaces, the others add",
        format!("{} FREE frames", free_frames.len()),
    );
    let free_kib = free_pages.len() as u64 * 4;
    let mf: BTreeMap<&str, u64> = [
        ("before", g["memfree_kib_before"].as_u64().unwrap_or(0)),
        ("after", g["memfree_kib_after"].as_u64().unwrap_or(0)),
    ]
    .into_iter()
    .collect();
    let lo = mf.values().min().copied().unwrap_or(0);
    let hi = mf.values().max().copied().unwrap_or(0);
    let tol = hi * a.free_tolerance_permille / 1000;
    c.check(
        free_kib + tol >= lo && free_kib <= hi + tol,
        "FREE ranges add up to MemFree within the tolerance",
        format!(
            "FREE {free_kib} KiB vs MemFree {lo}..{hi} KiB (difference {} KiB, tolerance {} permille = {tol} KiB)",
            (i128::from(free_kib) - i128::from((lo + hi) / 2)),
            a.free_tolerance_permille
        ),
    );
    let damon_all: Vec<&vmtier_hint_proto::HintRange> = w
        .hints
        .iter()
        .flat_map(|f| f.ranges.iter())
        .filter(|r| r.source == HintSource::GuestDamon && r.kind == HintKind::Hot)
        .collect();
    let damon = damon_all.len();
    let damon_pages = pages_of(&damon_all);
    let covered = want_hot.iter().filter(|p| damon_pages.contains(p)).count();
    c.check(
        covered > 0,
        "the guest's DAMON (paddr) reported HOT ranges covering the hot buffer",
        format!(
            "{covered} of {} buffer pages inside its HOT ranges over the run ({} ranges, {} KiB in all)",
            want_hot.len(),
            damon,
            damon_pages.len() * 4
        ),
    );
    let snapshots: BTreeSet<u64> = w.hints.iter().map(|h| h.epoch).collect();
    println!(
        "agent-host: {} HINTS frames over {} snapshots; epoch {epoch}: {} frames, {} FREE ranges ({free_kib} KiB), {} HOT app pages, {} PINNED, {} COLD, {} guest-DAMON HOT ranges over the run",
        w.hints.len(),
        snapshots.len(),
        frames.len(),
        free.len(),
        got_hot.len(),
        want_pinned.len(),
        want_cold.len(),
        damon
    );
}
