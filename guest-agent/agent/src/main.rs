//! `vmtier-agent`: runs inside a guest and tells the host's vmtierd which guest-physical
//! ranges are free, hot, cold or latency-critical, over the virtio-serial port
//! `org.vmtier.agent.0` (or a serial line), in the hint protocol of
//! `docs/hint-protocol.md`. See `docs/guest-agent.md`.

mod agent;
mod app;
mod config;
mod pagemap;
mod port;
mod ranges;
mod session;
mod sources;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use vmtier_hint_proto::{Body, Decoder, Frame, Welcome, FLAG_REPLACE};

use crate::agent::{chain, Mode, Sources};
use crate::config::Config;
use crate::ranges::{source_name, Kind, Source, PAGE};
use crate::session::Session;

#[derive(Parser, Debug)]
#[command(
    name = "vmtier-agent",
    version,
    about = "vmtier guest agent: placement hints for the host"
)]
struct Cli {
    /// Configuration file (TOML). A missing default file means all defaults.
    #[arg(long, short = 'c', default_value = config::DEFAULT_PATH)]
    config: PathBuf,
    /// Serial line to the host instead of the virtio-serial port (overrides agent.port).
    #[arg(long, value_name = "DEV")]
    serial: Option<PathBuf>,
    /// Take one snapshot, send it, say BYE and exit (non-zero if it could not be sent).
    #[arg(long, conflicts_with_all = ["print", "check"])]
    once: bool,
    /// With --once: give up after this many ms without WELCOME or without the frames sent.
    #[arg(long, default_value_t = 15_000, value_name = "MS")]
    timeout_ms: u64,
    /// Take one snapshot and print the frames it would send, decoded; send nothing.
    #[arg(long, conflicts_with = "check")]
    print: bool,
    /// Print which hint sources work here and why the others do not; send nothing.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_secs()
        .init();
    let cli = Cli::parse();
    let explicit = cli.config.as_path() != Path::new(config::DEFAULT_PATH);
    let mut cfg = match Config::load(&cli.config, explicit) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmtier-agent: {}", chain(&e));
            return ExitCode::from(2);
        }
    };
    if let Some(s) = &cli.serial {
        cfg.agent.port = s.display().to_string();
    }
    if cli.check {
        return check(&cfg);
    }
    if cli.print {
        return print(&cfg);
    }
    agent::install_signals();
    let port = match port::resolve(&cfg.agent.port) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("vmtier-agent: {}", chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let mode = if cli.once {
        Mode::Once(cli.timeout_ms)
    } else {
        Mode::Daemon
    };
    match agent::run(&cfg, port, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmtier-agent: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `--check`: one line per source and one for the port.
fn check(cfg: &Config) -> ExitCode {
    let mut ok = true;
    match port::resolve(&cfg.agent.port).and_then(|p| port::open(&p).map(|_| p)) {
        Ok(p) => println!("port: {} (opens)", p.display()),
        Err(e) => {
            ok = false;
            println!("port: unavailable: {}", chain(&e));
        }
    }
    let mut on = cfg.clone();
    // Probe every source, enabled or not, and say which are configured off.
    on.free_pages.enabled = true;
    on.damon.enabled = true;
    on.pmu.enabled = true;
    let mut s = Sources::start(&on);
    let why: BTreeMap<Source, String> = s.unavailable.iter().cloned().collect();
    let enabled = |src: Source| match src {
        Source::FreePages => cfg.free_pages.enabled,
        Source::GuestDamon => cfg.damon.enabled,
        Source::Pmu => cfg.pmu.enabled,
        Source::App => cfg.app.enabled,
        Source::Process => !cfg.process.is_empty(),
    };
    for src in ranges::SOURCES {
        let state = if !enabled(src) {
            " (disabled in the configuration)"
        } else {
            ""
        };
        match (src, why.get(&src)) {
            (_, Some(w)) => println!("{}: unavailable: {w}{state}", source_name(src)),
            (Source::App, None) => {
                let dir = cfg.app.socket.parent().unwrap_or(Path::new("/"));
                if dir.is_dir() {
                    println!(
                        "app: available (socket {}){state}",
                        cfg.app.socket.display()
                    )
                } else {
                    println!("app: unavailable: no directory {}{state}", dir.display())
                }
            }
            (Source::Process, None) => {
                match pagemap::translate(std::process::id() as i32, stack_page(), PAGE) {
                    Ok(_) => println!("process: available ({} rules){state}", cfg.process.len()),
                    Err(e) => println!("process: unavailable: {e}{state}"),
                }
            }
            (_, None) => println!("{}: available{state}", source_name(src)),
        }
    }
    s.stop();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn stack_page() -> u64 {
    let x = 0u8;
    std::ptr::addr_of!(x) as u64 & !(PAGE - 1)
}

/// `--print`: one snapshot, encoded with the host's default limits, decoded back and printed.
fn print(cfg: &Config) -> ExitCode {
    let mut sources = Sources::start(cfg);
    let (hints, reports) = sources.snapshot(None);
    sources.stop();
    for (src, r) in &reports {
        match &r.error {
            Some(e) => println!("# {}: error: {e}", source_name(*src)),
            None => println!(
                "# {}: {} ranges, {} KiB",
                source_name(*src),
                r.ranges,
                r.bytes / 1024
            ),
        }
    }
    // A session as if the host had answered with its defaults and no rate limit applied.
    let now = Instant::now();
    let mut s = Session::new(&cfg.agent.name, u32::MAX, u32::MAX, now);
    s.hello(now);
    let mut w = Vec::new();
    let welcome = Welcome {
        version: vmtier_hint_proto::VERSION,
        max_frame_bytes: u32::try_from(vmtier_hint_proto::MAX_FRAME_BYTES).unwrap_or(u32::MAX),
        max_ranges: u32::try_from(vmtier_hint_proto::MAX_RANGES_PER_FRAME).unwrap_or(u32::MAX),
        frames_per_s: u32::MAX,
        bytes_per_s: u32::MAX,
    };
    let _ = Frame::new(1, Body::Welcome(welcome)).encode(&mut w);
    s.receive(&w, now);
    s.queue_snapshot(1, &hints);
    let mut bytes = Vec::new();
    loop {
        s.pump(now);
        bytes.extend_from_slice(s.output());
        s.consume_output(bytes.len());
        if s.queued() == 0 {
            break;
        }
    }
    let mut d = Decoder::new();
    let mut rest = &bytes[..];
    let mut totals: BTreeMap<(Kind, &str), (u64, u64)> = BTreeMap::new();
    let mut bad = 0;
    while !rest.is_empty() {
        let n = d.feed(rest);
        rest = &rest[n..];
        while let Some(r) = d.next_frame(|_| true) {
            let f = match r {
                Ok(f) => f,
                Err(e) => {
                    bad += 1;
                    println!("undecodable: {e}");
                    continue;
                }
            };
            match &f.body {
                Body::Hello(h) => println!(
                    "frame {} HELLO v{}..v{} name {:?}",
                    f.seq,
                    h.min_version,
                    h.max_version,
                    h.name_lossy()
                ),
                Body::Hints(h) => {
                    println!(
                        "frame {} HINTS epoch {} {} ranges{} ({} bytes)",
                        f.seq,
                        h.epoch,
                        h.ranges.len(),
                        if h.flags & FLAG_REPLACE != 0 {
                            " REPLACE"
                        } else {
                            ""
                        },
                        f.encoded_len()
                    );
                    for r in &h.ranges {
                        match r.check() {
                            Ok(x) => {
                                let kind = kind_of(x.kind);
                                let src = source_name(x.source);
                                println!(
                                    "  {:<6} {:#014x}-{:#014x} {:>10} KiB weight {:>3} {}",
                                    kind.to_string(),
                                    x.gpa,
                                    x.end(),
                                    x.len / 1024,
                                    x.weight,
                                    src
                                );
                                let t = totals.entry((kind, src)).or_default();
                                t.0 += 1;
                                t.1 += x.len;
                            }
                            Err(e) => {
                                bad += 1;
                                println!("  invalid range: {e}");
                            }
                        }
                    }
                }
                other => println!("frame {} {:?}", f.seq, other.frame_type()),
            }
        }
        if n == 0 {
            break;
        }
    }
    for ((kind, src), (n, b)) in &totals {
        println!("total {kind} from {src}: {n} ranges, {} KiB", b / 1024);
    }
    if bad > 0 {
        println!("{bad} frames or ranges did not decode");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn kind_of(k: vmtier_hint_proto::HintKind) -> Kind {
    use vmtier_hint_proto::HintKind as K;
    match k {
        K::Hot => Kind::Hot,
        K::Cold => Kind::Cold,
        K::Free => Kind::Free,
        K::Pinned => Kind::Pinned,
    }
}
