//! The module's ABI growth: the ioctl is dispatched on its type and number, the
//! structure's size comes from the command, so first-version (smaller) and future
//! (larger) structures work; a larger one's extra bytes must be zero and the size field
//! must match the command.

use vmtier_migrate::uapi::{self, VmtierMigrate, VmtierQuery};
use vmtier_migrate::{Kmod, KmodConfig};

use crate::check::Checks;
use crate::kmod_errors::{base_req, errno_name, expect, range};
use crate::mem::AnonBuf;

/// A canary the module must not overwrite past the structure's size.
const CANARY: u64 = 0x5eed_cafe_f00d_beef;

/// Issues `cmd` on `words` and returns 0 or the errno.
fn raw(k: &Kmod, cmd: u64, words: &mut [u64]) -> i32 {
    // SAFETY: the module reads and writes at most _IOC_SIZE(cmd) bytes, which every
    // caller keeps within `words`; pointers inside are live or deliberately refused.
    match unsafe { k.raw_ioctl(cmd, words.as_mut_ptr()) } {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// A `VmtierMigrate` announcing `size` bytes in a buffer of `total` words: the fields it
/// has room for copied, zero up to `size`, [`CANARY`] after.
fn migrate_words(m: &VmtierMigrate, total: usize, size: usize) -> Vec<u64> {
    let fields = std::mem::size_of::<VmtierMigrate>() / 8;
    let mut w = vec![CANARY; total.max(size / 8)];
    // SAFETY: VmtierMigrate is `fields` plain u64s.
    let src = unsafe { std::slice::from_raw_parts(std::ptr::from_ref(m).cast::<u64>(), fields) };
    let n = (size / 8).min(fields);
    w[..n].copy_from_slice(&src[..n]);
    for x in w.iter_mut().take(size / 8).skip(fields) {
        *x = 0;
    }
    w[0] = size as u64;
    w
}

pub fn run(c: &mut Checks) {
    let k = match Kmod::open(KmodConfig::default()) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    let cur_q = std::mem::size_of::<VmtierQuery>();
    let cur_m = std::mem::size_of::<VmtierMigrate>();
    let v1_q = uapi::QUERY_SIZE_VER1;
    let v1_m = uapi::MIGRATE_SIZE_VER1;

    // QUERY, first version: 352 bytes in, nothing written past them.
    let mut w = vec![CANARY; cur_q / 8 + 4];
    w[..v1_q / 8].fill(0);
    w[0] = v1_q as u64;
    let e = raw(&k, uapi::ioc_query(v1_q), &mut w);
    c.check(
        e == 0 && w[1] == uapi::ABI_VERSION && w[v1_q / 8] == CANARY,
        "QUERY with the first version's 352-byte structure",
        format!(
            "{}; abi {} max_ranges {}; word after the structure {:#x}",
            errno_name(e),
            w[1],
            w[3],
            w[v1_q / 8]
        ),
    );
    // QUERY, current size.
    let mut w = vec![0u64; cur_q / 8 + 4];
    w[0] = cur_q as u64;
    let e = raw(&k, uapi::IOC_QUERY, &mut w);
    c.check(
        e == 0 && w[v1_q / 8] >= 1 && w[v1_q / 8 + 2] == uapi::MIGRATE_FLAGS_ALL,
        "QUERY with the current structure: default workers and flags reported",
        format!(
            "{}; default_workers {} housekeeping_cpus {} migrate_flags {:#x}",
            errno_name(e),
            w[v1_q / 8],
            w[v1_q / 8 + 1],
            w[v1_q / 8 + 2]
        ),
    );
    // QUERY from a newer program: 64 more bytes, zero, then nonzero.
    let big = cur_q + 64;
    let mut w = vec![0u64; big / 8];
    w[0] = big as u64;
    expect(
        c,
        "QUERY, larger structure with a zero tail",
        raw(&k, uapi::ioc_query(big), &mut w),
        0,
    );
    let mut w = vec![0u64; big / 8];
    w[0] = big as u64;
    w[big / 8 - 1] = 1;
    expect(
        c,
        "QUERY, larger structure with a nonzero tail",
        raw(&k, uapi::ioc_query(big), &mut w),
        libc::E2BIG,
    );
    let mut w = vec![0u64; cur_q / 8];
    w[0] = v1_q as u64;
    expect(
        c,
        "QUERY, size field not the command's size",
        raw(&k, uapi::IOC_QUERY, &mut w),
        libc::EINVAL,
    );
    let mut w = vec![0u64; 4];
    w[0] = 16;
    expect(
        c,
        "QUERY, smaller than the first version",
        raw(&k, uapi::ioc_query(16), &mut w),
        libc::EINVAL,
    );

    // MIGRATE with each size.
    let buf = match AnonBuf::new_on_node(2 << 20, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let pages = buf.len() as u64 / 4096;
    for (name, size, to, zero_tail) in [
        ("first version's 168 bytes", v1_m, 0u32, true),
        ("current structure", cur_m, 1, true),
        ("larger structure, zero tail", cur_m + 48, 0, true),
    ] {
        let mut rs = [range(buf.addr().raw(), buf.len() as u64)];
        let mut m = base_req(&mut rs);
        m.node = u64::from(to);
        let n = size / 8;
        let mut w = migrate_words(&m, n + 2, size);
        if !zero_tail {
            w[n - 1] = 1;
        }
        let e = raw(&k, uapi::ioc_migrate(size), &mut w);
        // word 11 is `moved`; the word after the structure must be untouched.
        c.check(
            e == 0 && w[11] == pages && rs[0].moved == pages && w[n] == CANARY,
            &format!("MIGRATE with the {name}: moves, answers within its size"),
            format!(
                "{}; moved {} (range {}); word after the structure {:#x}",
                errno_name(e),
                w[11],
                rs[0].moved,
                w[n]
            ),
        );
        if size == v1_m {
            c.check(
                w[v1_m / 8..v1_m / 8 + 2].iter().all(|&x| x == CANARY),
                "MIGRATE v1: the second version's outputs are not written",
                format!("{:#x?}", &w[v1_m / 8..v1_m / 8 + 2]),
            );
        }
    }
    let mut rs = [range(buf.addr().raw(), buf.len() as u64)];
    let m = base_req(&mut rs);
    let size = cur_m + 48;
    let mut w = migrate_words(&m, size / 8, size);
    w[size / 8 - 1] = 7;
    expect(
        c,
        "MIGRATE, larger structure with a nonzero tail",
        raw(&k, uapi::ioc_migrate(size), &mut w),
        libc::E2BIG,
    );
    let mut w = migrate_words(&m, cur_m / 8, v1_m);
    expect(
        c,
        "MIGRATE, size field not the command's size",
        raw(&k, uapi::IOC_MIGRATE, &mut w),
        libc::EINVAL,
    );
    let mut w = migrate_words(&m, 8, 64);
    expect(
        c,
        "MIGRATE, smaller than the first version",
        raw(&k, uapi::ioc_migrate(64), &mut w),
        libc::EINVAL,
    );
    let mut w = migrate_words(&m, cur_m / 8, cur_m);
    expect(
        c,
        "unknown ioctl number",
        raw(&k, uapi::iowr(uapi::IOC_MAGIC, 0x7f, cur_m), &mut w),
        libc::ENOTTY,
    );
    expect(
        c,
        "another ioctl type",
        raw(&k, uapi::iowr(u64::from(b'X'), 1, cur_m), &mut w),
        libc::ENOTTY,
    );
    // _IOR instead of _IOWR.
    let ior = (2 << 30) | ((cur_m as u64) << 16) | (uapi::IOC_MAGIC << 8) | 1;
    expect(
        c,
        "MIGRATE without the write direction",
        raw(&k, ior, &mut w),
        libc::ENOTTY,
    );
}
