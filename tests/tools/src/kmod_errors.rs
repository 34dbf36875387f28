//! The vmtier module's bad-input, DMA fault, busy-module and signal checks: every bad
//! request gets a clean errno (the testbed runner fails the run on any oops or warning).

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vmtier_core::{HostVirtAddr, NodeId};
use vmtier_migrate::uapi::{self, VmtierMigrate, VmtierRange};
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig};

use crate::check::Checks;
use crate::kmod::{kstat, sh};
use crate::mem::AnonBuf;

const MIB: usize = 1 << 20;

pub(crate) fn errno_name(e: i32) -> &'static str {
    match e {
        0 => "ok",
        libc::EINVAL => "EINVAL",
        libc::E2BIG => "E2BIG",
        libc::EFAULT => "EFAULT",
        libc::ESRCH => "ESRCH",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENODEV => "ENODEV",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOTTY => "ENOTTY",
        libc::EINTR => "EINTR",
        _ => "other",
    }
}

pub(crate) fn base_req(ranges: &mut [VmtierRange]) -> VmtierMigrate {
    VmtierMigrate {
        size: std::mem::size_of::<VmtierMigrate>() as u64,
        ranges: ranges.as_mut_ptr() as u64,
        nr_ranges: ranges.len() as u64,
        engine: uapi::ENGINE_CPU,
        ..Default::default()
    }
}

pub(crate) fn range(start: u64, len: u64) -> VmtierRange {
    VmtierRange {
        start,
        len,
        ..Default::default()
    }
}

/// Issues MIGRATE and returns 0 or the errno.
pub(crate) fn call(k: &Kmod, m: &mut VmtierMigrate) -> i32 {
    // SAFETY: m is a VmtierMigrate; its ranges pointer is either a live array of
    // nr_ranges entries or deliberately bad, which the module must reject with EFAULT
    // without touching our memory elsewhere.
    match unsafe { k.raw_ioctl(uapi::IOC_MIGRATE, m) } {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

pub(crate) fn expect(c: &mut Checks, name: &str, got: i32, want: i32) {
    c.check(
        got == want,
        name,
        format!("{} (want {})", errno_name(got), errno_name(want)),
    );
}

/// A mapping made by mmap with the given flags and fd, unmapped on drop.
pub(crate) struct Map(*mut libc::c_void, usize);

impl Map {
    pub(crate) fn new(len: usize, flags: libc::c_int, fd: libc::c_int) -> Option<Self> {
        // SAFETY: a fresh mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: the mapping is ours and len bytes long; touch it to populate.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len.min(4096)) };
        Some(Self(p, len))
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0 as u64
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

pub fn run(c: &mut Checks) {
    let k = match Kmod::open(KmodConfig::default()) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    let buf = match AnonBuf::new_on_node(4 * MIB, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let a = buf.addr().raw();
    let len = buf.len() as u64;
    let mut rs = [range(a, len)];

    let mut m = base_req(&mut rs);
    expect(c, "valid request", call(&k, &mut m), 0);
    let mut m = base_req(&mut rs);
    m.pid = 4_194_305;
    expect(c, "pid above PID_MAX_LIMIT", call(&k, &mut m), libc::ESRCH);
    let mut m = base_req(&mut rs);
    m.pid = 4_000_000;
    expect(c, "pid not in use", call(&k, &mut m), libc::ESRCH);
    let mut m = base_req(&mut rs);
    m.node = 7;
    expect(
        c,
        "node that does not exist",
        call(&k, &mut m),
        libc::ENODEV,
    );
    let mut m = base_req(&mut rs);
    m.node = 1 << 40;
    expect(
        c,
        "node number out of range",
        call(&k, &mut m),
        libc::ENODEV,
    );
    let mut m = base_req(&mut rs);
    m.flags = 1 << 9;
    expect(c, "unknown flag", call(&k, &mut m), libc::EINVAL);
    let mut m = base_req(&mut rs);
    m.reserved[3] = 1;
    expect(
        c,
        "nonzero reserved in the request",
        call(&k, &mut m),
        libc::EINVAL,
    );
    let mut rs2 = [range(a, len)];
    rs2[0].reserved = 5;
    let mut m = base_req(&mut rs2);
    expect(
        c,
        "nonzero reserved in a range",
        call(&k, &mut m),
        libc::EINVAL,
    );
    let mut m = base_req(&mut rs);
    m.engine = 9;
    expect(c, "unknown engine", call(&k, &mut m), libc::EINVAL);
    let mut m = base_req(&mut rs);
    m.batch = uapi::MAX_BATCH + 1;
    expect(c, "batch above the maximum", call(&k, &mut m), libc::EINVAL);
    let mut m = base_req(&mut rs);
    m.size = 8;
    expect(c, "size too small", call(&k, &mut m), libc::EINVAL);
    let mut m = base_req(&mut rs);
    m.nr_ranges = 0;
    expect(c, "zero ranges", call(&k, &mut m), libc::EINVAL);
    let mut m = base_req(&mut rs);
    m.nr_ranges = uapi::MAX_RANGES + 1;
    expect(c, "huge range count", call(&k, &mut m), libc::E2BIG);
    let mut m = base_req(&mut rs);
    m.ranges = 16;
    expect(c, "bad ranges pointer", call(&k, &mut m), libc::EFAULT);
    for (name, r) in [
        ("misaligned start", range(a + 8, 4096)),
        ("misaligned length", range(a, 4095)),
        ("zero length", range(a, 0)),
        ("length beyond the address space", range(a, 1 << 60)),
        ("wrapping range", range(u64::MAX - 4095, 8192)),
    ] {
        let mut rr = [r];
        let mut m = base_req(&mut rr);
        expect(c, name, call(&k, &mut m), libc::EINVAL);
    }
    let mut rr = [range(0x1000, 4096)];
    let mut m = base_req(&mut rr);
    expect(c, "unmapped range", call(&k, &mut m), libc::EFAULT);
    let mut rr = [range(a + len - 4096, 2 * 2 * MIB as u64)];
    let mut m = base_req(&mut rr);
    expect(
        c,
        "range running past its VMA into a hole",
        call(&k, &mut m),
        libc::EFAULT,
    );

    // A larger structure from a newer userspace: zero tail accepted, nonzero refused.
    let mut big = [0u64; 32];
    let m0 = base_req(&mut rs);
    // SAFETY: VmtierMigrate is plain u64s, 26 of them, copied into a 32-word buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::addr_of!(m0).cast::<u64>(), big.as_mut_ptr(), 26);
    }
    big[0] = 32 * 8;
    // SAFETY: the module reads size (256) bytes from big, which is 256 bytes long.
    let r = unsafe { k.raw_ioctl(uapi::ioc_migrate(256), big.as_mut_ptr()) };
    expect(
        c,
        "larger structure, zero tail",
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0),
        0,
    );
    big[30] = 1;
    // SAFETY: as above.
    let r = unsafe { k.raw_ioctl(uapi::ioc_migrate(256), big.as_mut_ptr()) };
    expect(
        c,
        "larger structure, nonzero tail",
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0),
        libc::E2BIG,
    );
    // SAFETY: an ioctl number the module does not know; the argument is unused.
    let r = unsafe { k.raw_ioctl(0xc008_b77f, big.as_mut_ptr()) };
    expect(
        c,
        "unknown ioctl",
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0),
        libc::ENOTTY,
    );

    // Ranges spanning VMAs: two anonymous VMAs (split by mprotect) move in one range.
    // SAFETY: changes the protection of one page of our own buffer.
    unsafe {
        libc::mprotect(
            (a + 2 * MIB as u64) as *mut libc::c_void,
            4096,
            libc::PROT_READ,
        )
    };
    let mut rr = [range(a, len)];
    let mut m = base_req(&mut rr);
    let e = call(&k, &mut m);
    c.check(
        e == 0 && rr[0].moved + rr[0].on_target == len / 4096,
        "range spanning three private anonymous VMAs moves",
        format!(
            "{} moved {} on_target {}",
            errno_name(e),
            rr[0].moved,
            rr[0].on_target
        ),
    );

    unsupported_mappings(c, &k);
    permissions(c, &k, &buf);
    cpuset(c, &k);
    target_exits(c);
    fatal_signal(c);
}

fn unsupported_mappings(c: &mut Checks, k: &Kmod) {
    let len = 2 * MIB;
    let mut maps: Vec<(&str, Option<Map>)> = vec![(
        "MAP_SHARED anonymous",
        Map::new(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
    )];
    // SAFETY: memfd_create with a static NUL-terminated name.
    let memfd = unsafe { libc::memfd_create(c"vmtier-test".as_ptr(), 0) };
    // SAFETY: sizing our own memfd.
    if memfd >= 0 && unsafe { libc::ftruncate(memfd, len as libc::off_t) } == 0 {
        maps.push(("memfd (shmem)", Map::new(len, libc::MAP_SHARED, memfd)));
    }
    let _ = fs::write("/proc/sys/vm/nr_hugepages", "2");
    maps.push((
        "hugetlb",
        Map::new(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
            -1,
        ),
    ));
    // SAFETY: opening /dev/mem with a static path; the first MiB is allowed under
    // STRICT_DEVMEM and mapping it gives a VM_IO | VM_PFNMAP VMA.
    let devmem = unsafe { libc::open(c"/dev/mem".as_ptr(), libc::O_RDWR | libc::O_SYNC) };
    if devmem >= 0 {
        // SAFETY: a shared mapping of the first page of /dev/mem, never written.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                devmem,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            maps.push(("VM_IO (/dev/mem)", Some(Map(p, 4096))));
        }
    }
    for (name, map) in &maps {
        let Some(map) = map else {
            c.check(false, &format!("{name}: mapping created"), "mmap failed");
            continue;
        };
        let mut rr = [range(map.addr(), map.1 as u64)];
        let mut m = base_req(&mut rr);
        expect(
            c,
            &format!("{name} refused"),
            call(k, &mut m),
            libc::EOPNOTSUPP,
        );
        let mut rr = [range(map.addr(), map.1 as u64)];
        let mut m = base_req(&mut rr);
        m.flags = uapi::MIGRATE_SKIP_UNSUPPORTED;
        let e = call(k, &mut m);
        c.check(
            e == 0 && rr[0].skipped_shared == map.1 as u64 / 4096 && rr[0].moved == 0,
            &format!("{name} skipped with SKIP_UNSUPPORTED"),
            format!("{} skipped_shared {}", errno_name(e), rr[0].skipped_shared),
        );
    }
    drop(maps);
    // SAFETY: closing our own descriptors (or -1, which fails harmlessly).
    unsafe {
        libc::close(memfd);
        libc::close(devmem);
    }
    let _ = fs::write("/proc/sys/vm/nr_hugepages", "0");
}

/// capset(2) in the calling thread: keep only `keep` (a capability bit mask) effective.
pub(crate) fn keep_caps(keep: u32) -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let d = [
        Data {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads one header and two data structs, all live on the stack.
    unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) == 0 }
}

const CAP_SYS_NICE: u32 = 23;

/// Runs `f` in a forked child and returns what it exits with.
pub(crate) fn in_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork; the child only makes syscalls and exits with _exit.
    match unsafe { libc::fork() } {
        0 => {
            let r = f();
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(r) }
        }
        pid if pid > 0 => {
            let mut st = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                -1
            }
        }
        _ => -1,
    }
}

fn permissions(c: &mut Checks, k: &Kmod, buf: &AnonBuf) {
    let parent = std::process::id() as u64;
    let (a, len) = (buf.addr().raw(), buf.len() as u64);
    // Without CAP_SYS_NICE, even on itself.
    let e = in_child(|| {
        if !keep_caps(0) {
            return 99;
        }
        let mut rr = [range(a, len)];
        let mut m = base_req(&mut rr);
        call(k, &mut m)
    });
    expect(c, "caller without CAP_SYS_NICE", e, libc::EPERM);
    // With CAP_SYS_NICE but another uid and no CAP_SYS_PTRACE: no ptrace access to root.
    let e = in_child(|| {
        // SAFETY: keep permitted capabilities across setresuid, then drop to nobody.
        unsafe {
            libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0);
            if libc::setresuid(65534, 65534, 65534) != 0 {
                return 98;
            }
        }
        if !keep_caps(1 << CAP_SYS_NICE) {
            return 99;
        }
        let mut rr = [range(a, len)];
        let mut m = base_req(&mut rr);
        m.pid = parent;
        call(k, &mut m)
    });
    expect(
        c,
        "uid nobody with CAP_SYS_NICE on a root process (ptrace check)",
        e,
        libc::EPERM,
    );
}

/// A forked child holding a 4K buffer on `node`, stopped until killed.
pub(crate) struct Victim {
    _buf: AnonBuf,
    pub(crate) pid: libc::pid_t,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

impl Victim {
    pub(crate) fn start(len: usize, node: u32) -> Option<Self> {
        let buf = AnonBuf::new_on_node(len, false, node).ok()?;
        let (addr, l) = (buf.addr().raw(), buf.len() as u64);
        // SAFETY: fork; the child only sleeps (its copy of buf is private memory).
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: the child only waits for its SIGKILL.
                unsafe { libc::pause() };
            },
            pid if pid > 0 => {
                // The child's pages stay COW-shared with this copy until both are gone.
                Some(Self {
                    _buf: buf,
                    pid,
                    addr,
                    len: l,
                })
            }
            _ => None,
        }
    }

    pub(crate) fn kill(self) {
        // SAFETY: signals and reaps our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

fn cpuset(c: &mut Checks, k: &Kmod) {
    let Some(v) = Victim::start(4 * MIB, 0) else {
        return c.fatal("fork a target", "fork failed");
    };
    let g = "/sys/fs/cgroup/vmtier-test";
    let setup = format!(
        "echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control; mkdir -p {g} && \
         echo 0 > {g}/cpuset.mems && echo {} > {g}/cgroup.procs",
        v.pid
    );
    let (ok, out) = sh(&setup);
    if c.check(ok, "target placed in a cpuset with mems=0", &out) {
        let mut rr = [range(v.addr, v.len)];
        let mut m = base_req(&mut rr);
        m.pid = v.pid as u64;
        m.node = 1;
        expect(
            c,
            "node not in the target's cpuset",
            call(k, &mut m),
            libc::EACCES,
        );
    }
    v.kill();
    let _ = sh(&format!("rmdir {g}"));
}

/// The target exits while the module works on it: ESRCH or done, no oops, no leak.
fn target_exits(c: &mut Checks) {
    let Some(v) = Victim::start(64 * MIB, 1) else {
        return c.fatal("fork a target", "fork failed");
    };
    let pid = v.pid;
    let (addr, len) = (v.addr, v.len);
    let h = thread::spawn(move || {
        let cfg = KmodConfig {
            engine: CopyEngine::Cpu,
            workers: 1,
            batch: 64,
        };
        let mut k = Kmod::open(cfg).ok()?;
        Some(
            k.migrate_ranges(
                vmtier_core::ProcessId::new(pid),
                &[(HostVirtAddr::new(addr), len)],
                NodeId::new(0),
            )
            .map_err(|e| e.errno()),
        )
    });
    thread::sleep(Duration::from_millis(150));
    v.kill();
    let r = h.join().ok().flatten();
    let desc = match &r {
        Some(Ok(rep)) => format!("finished first: moved {}", rep.sum(|x| x.moved)),
        Some(Err(e)) => format!("errno {}", errno_name(e.unwrap_or(0))),
        None => "no result".into(),
    };
    c.check(
        matches!(r, Some(Ok(_)) | Some(Err(Some(libc::ESRCH)))),
        "target killed during the call: ESRCH (or finished first)",
        format!(
            "{desc}; calls_target_exited {}",
            kstat("calls_target_exited")
        ),
    );
}

/// The caller gets SIGKILL mid-call: it dies promptly, nothing is left isolated.
fn fatal_signal(c: &mut Checks) {
    let interrupted0 = kstat("calls_interrupted");
    // SAFETY: fork; the child migrates its own buffer in a loop until killed.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let cfg = KmodConfig {
            engine: CopyEngine::Cpu,
            workers: 2,
            batch: 64,
        };
        if let (Ok(buf), Ok(mut k)) = (AnonBuf::new_on_node(64 * MIB, false, 1), Kmod::open(cfg)) {
            for to in [0u32, 1].iter().cycle() {
                let _ = k.migrate_ranges(
                    vmtier_core::ProcessId::new(0),
                    &[(buf.addr(), buf.len() as u64)],
                    NodeId::new(*to),
                );
            }
        }
        // SAFETY: leaves the child.
        unsafe { libc::_exit(0) };
    }
    thread::sleep(Duration::from_millis(1500));
    // SAFETY: signals and reaps our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    c.check(
        kstat("active") == 0,
        "caller killed mid-call: the call ends, nothing active",
        format!(
            "calls_interrupted +{}, pages moved so far {}",
            kstat("calls_interrupted") - interrupted0,
            kstat("pages_moved")
        ),
    );
}

pub(crate) fn set(module: &str, name: &str, value: &str) {
    let _ = fs::write(format!("/sys/module/{module}/parameters/{name}"), value);
}

/// rmmod while a migration runs is refused; the migration completes intact. The migration
/// takes a few hundred milliseconds under TCG and rmmod is tried only once the module counts
/// the call active, so the outcome does not depend on the machine's load.
pub fn busy(c: &mut Checks, ko_dir: &Path) {
    let _ = ko_dir;
    let buf = match AnonBuf::new_on_node(64 * MIB, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let (addr, len) = (buf.addr(), buf.len() as u64);
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let h = thread::spawn(move || {
        let cfg = KmodConfig {
            engine: CopyEngine::Cpu,
            workers: 2,
            batch: 64,
        };
        let r = Kmod::open(cfg).map(|mut k| {
            k.migrate_ranges(
                vmtier_core::ProcessId::new(0),
                &[(addr, len)],
                NodeId::new(0),
            )
        });
        d.store(true, Ordering::Release);
        r
    });
    let waited = std::time::Instant::now();
    while kstat("active") < 1
        && !done.load(Ordering::Acquire)
        && waited.elapsed() < Duration::from_secs(10)
    {
        thread::sleep(Duration::from_millis(2));
    }
    let active = kstat("active");
    let (ok, out) = sh("rmmod vmtier");
    let finished_before = done.load(Ordering::Acquire);
    let r = h.join();
    c.check(
        !ok,
        "rmmod vmtier while a migration runs is refused",
        format!("active {active}, finished before rmmod: {finished_before}; {out}"),
    );
    let moved = matches!(&r, Ok(Ok(Ok(rep))) if rep.sum(|x| x.moved) == len / 4096);
    c.check(
        moved && buf.corrupted_words() == 0,
        "the migration completes intact",
        format!("{}", buf.corrupted_words()),
    );
}
