//! vmtierd's configuration parser ([`Config::parse`]: TOML, the option enums, every bound,
//! the policy's own parameters) on arbitrary text.
//!
//! Besides "no panic": an error is one line without control characters (it goes to the log
//! as is), and an accepted
//! configuration written back as TOML parses to the same configuration.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vmtier_daemon::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.chars().any(char::is_control), "one line: {msg:?}");
        }
        Ok(cfg) => {
            let again = toml::to_string(&cfg).expect("a parsed config serializes");
            let back = Config::parse(&again).expect("a serialized config parses");
            assert_eq!(back, cfg, "{again}");
        }
    }
});
