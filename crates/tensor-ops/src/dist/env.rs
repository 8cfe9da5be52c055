//! The process group's shape from the environment, the `torch.distributed` way: `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, as set by
//! `hybrid-trainer launch` (or torchrun, or a cluster scheduler's wrapper).

use super::DistError;
use std::net::Ipv6Addr;

/// The port [`DistEnv`] assumes for a one-process "group" when `MASTER_PORT` is unset.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The address [`DistEnv`] assumes for a one-process "group" when `MASTER_ADDR` is unset.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// One process's place in a data-parallel group (the torch.distributed convention).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    /// This process's rank in `0..world_size`; rank 0 hosts the rendezvous.
    pub rank: usize,
    /// How many processes take part, over all nodes.
    pub world_size: usize,
    /// This process's rank among the processes of its node (its GPU ordinal).
    pub local_rank: usize,
    /// How many processes run on this node.
    pub local_world_size: usize,
    /// Where rank 0 listens: a host name or an IP address (an IPv6 literal without brackets).
    pub master_addr: String,
    /// The TCP port rank 0 listens on.
    pub master_port: u16,
}

impl DistEnv {
    /// Reads the process environment; see [`DistEnv::from_lookup`]. A value that is not
    /// UTF-8 is an error naming its variable.
    pub fn from_env() -> Result<Option<DistEnv>, DistError> {
        for var in VARS {
            env_var(var)?;
        }
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// `Ok(None)` when `WORLD_SIZE` is unset (a plain single-process run). Otherwise every
    /// variable is checked: `RANK` (required), `WORLD_SIZE` (>= 1), `LOCAL_RANK` (default:
    /// `RANK`), `LOCAL_WORLD_SIZE` (default: `WORLD_SIZE`), `MASTER_ADDR` (default 127.0.0.1
    /// only when `WORLD_SIZE` is 1, else required) and `MASTER_PORT` (1..=65535; default 29500
    /// only when `WORLD_SIZE` is 1), with rank < world_size, local_rank < local_world_size and
    /// local_world_size <= world_size. Surrounding whitespace is ignored; anything else that
    /// is off is a [`DistError::Env`] naming the variable and its value.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>, DistError> {
        let Some(world) = get("WORLD_SIZE") else {
            return Ok(None);
        };
        let world_size = parse_count("WORLD_SIZE", &world)?;
        let rank = match get("RANK") {
            Some(v) => parse_index("RANK", &v)?,
            None => return Err(missing("RANK", "WORLD_SIZE is set")),
        };
        check_below(("RANK", rank), ("WORLD_SIZE", world_size))?;
        let local_world_size = parse_or(&get, "LOCAL_WORLD_SIZE", parse_count, world_size)?;
        if local_world_size > world_size {
            return Err(env_err(
                "LOCAL_WORLD_SIZE",
                format!("{local_world_size} exceeds WORLD_SIZE={world_size}"),
            ));
        }
        let local_rank = parse_or(&get, "LOCAL_RANK", parse_index, rank)?;
        check_below(
            ("LOCAL_RANK", local_rank),
            ("LOCAL_WORLD_SIZE", local_world_size),
        )?;
        let master_addr = match get("MASTER_ADDR") {
            Some(v) => parse_addr(&v)?,
            None if world_size == 1 => DEFAULT_MASTER_ADDR.to_string(),
            None => return Err(missing("MASTER_ADDR", "WORLD_SIZE > 1")),
        };
        let master_port = match get("MASTER_PORT") {
            Some(v) => parse_port(&v)?,
            None if world_size == 1 => DEFAULT_MASTER_PORT,
            None => return Err(missing("MASTER_PORT", "WORLD_SIZE > 1")),
        };
        Ok(Some(DistEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }))
    }

    /// Rank 0: the process that hosts the rendezvous and writes logs and checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// `host:port`, with an IPv6 literal in brackets (`[::1]:29500`).
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

fn env_err(var: &'static str, reason: String) -> DistError {
    DistError::Env { var, reason }
}

/// Variable `var` through `parse` (which names it in its errors), or `default` when unset.
fn parse_or<T>(
    get: impl Fn(&str) -> Option<String>,
    var: &'static str,
    parse: fn(&'static str, &str) -> Result<T, DistError>,
    default: T,
) -> Result<T, DistError> {
    match get(var) {
        Some(v) => parse(var, &v),
        None => Ok(default),
    }
}

/// An index variable `(var, value)` must be below the count variable `(of, count)`.
fn check_below(
    (var, value): (&'static str, usize),
    (of, count): (&str, usize),
) -> Result<(), DistError> {
    if value >= count {
        return Err(env_err(var, format!("{value} is not below {of}={count}")));
    }
    Ok(())
}

fn missing(var: &'static str, why: &str) -> DistError {
    env_err(var, format!("not set, but it is required when {why}"))
}

fn nonempty<'a>(var: &'static str, value: &'a str) -> Result<&'a str, DistError> {
    let t = value.trim();
    if t.is_empty() {
        Err(env_err(var, format!("{value:?} is empty")))
    } else {
        Ok(t)
    }
}

/// A non-negative integer.
fn parse_index(var: &'static str, value: &str) -> Result<usize, DistError> {
    nonempty(var, value)?.parse::<usize>().map_err(|e| {
        env_err(
            var,
            format!("{value:?} is not a non-negative integer ({e})"),
        )
    })
}

/// A positive integer.
fn parse_count(var: &'static str, value: &str) -> Result<usize, DistError> {
    match parse_index(var, value)? {
        0 => Err(env_err(var, format!("{value:?} must be at least 1"))),
        n if n > MAX_WORLD => Err(env_err(
            var,
            format!("{value:?} is more than {MAX_WORLD} processes"),
        )),
        n => Ok(n),
    }
}

/// The variables [`DistEnv::from_env`] reads.
const VARS: [&str; 6] = [
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// The most ranks a job may have (the rendezvous's gathers carry one u64 a rank).
pub const MAX_WORLD: usize = 1 << 16;

/// An environment variable's value (`None`: unset); a value that is not UTF-8 is an error.
pub fn env_var(var: &'static str) -> Result<Option<String>, DistError> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(env_err(var, format!("{v:?} is not valid UTF-8")))
        }
    }
}

fn parse_port(value: &str) -> Result<u16, DistError> {
    const VAR: &str = "MASTER_PORT";
    let n = nonempty(VAR, value)?
        .parse::<u64>()
        .map_err(|e| env_err(VAR, format!("{value:?} is not a port number ({e})")))?;
    match u16::try_from(n) {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(env_err(VAR, format!("{value:?} is not in 1..=65535"))),
    }
}

/// A host name or IP address; `[v6]` loses its brackets, and a `host:port` is refused (the
/// port belongs in `MASTER_PORT`).
fn parse_addr(value: &str) -> Result<String, DistError> {
    const VAR: &str = "MASTER_ADDR";
    let t = nonempty(VAR, value)?;
    if t.chars().any(char::is_whitespace) {
        return Err(env_err(VAR, format!("{value:?} contains whitespace")));
    }
    let bracketed = t.strip_prefix('[').and_then(|s| s.strip_suffix(']'));
    let inner = bracketed.unwrap_or(t);
    if inner.contains(':') || bracketed.is_some() {
        return match inner.parse::<Ipv6Addr>() {
            Ok(_) => Ok(inner.to_string()),
            Err(_) => Err(env_err(
                VAR,
                format!("{value:?} is neither a host name nor an IP address (put the port in MASTER_PORT)"),
            )),
        };
    }
    if inner.contains(['[', ']', '/']) {
        return Err(env_err(
            VAR,
            format!("{value:?} is not a host name or IP address"),
        ));
    }
    Ok(inner.to_string())
}

impl DistEnv {
    /// A single-node environment: rank `rank` of `world` processes, all on this host (the
    /// local ranks are the ranks), rank 0 listening at `127.0.0.1:port` (what the tests
    /// connect with).
    pub fn on_localhost(rank: usize, world: usize, port: u16) -> DistEnv {
        DistEnv {
            rank,
            world_size: world,
            local_rank: rank,
            local_world_size: world,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> Result<Option<DistEnv>, DistError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DistEnv::from_lookup(|k| map.get(k).cloned())
    }

    const FULL: [(&str, &str); 6] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "1234"),
    ];

    /// FULL with one variable replaced (`None`: removed).
    fn with(var: &str, value: Option<&str>) -> Result<Option<DistEnv>, DistError> {
        let mut v: Vec<(&str, &str)> = FULL.iter().copied().filter(|(k, _)| *k != var).collect();
        if let Some(x) = value {
            v.push((var, x));
        }
        lookup(&v)
    }

    /// Asserts an Env error naming `var` whose text mentions `needle`.
    fn assert_env_err(r: Result<Option<DistEnv>, DistError>, var: &str, needle: &str) {
        match r {
            Err(DistError::Env { var: v, reason }) => {
                assert_eq!(v, var, "{reason}");
                let text = DistError::Env { var: v, reason }.to_string();
                assert!(text.contains(needle), "{text} lacks {needle}");
                assert!(text.starts_with(var), "{text}");
            }
            other => panic!("{var}: expected an Env error, got {other:?}"),
        }
    }

    #[test]
    fn unset_world_size_is_a_single_process_run() {
        assert_eq!(lookup(&[]).unwrap(), None);
        // Other variables alone do not make a group.
        assert_eq!(
            lookup(&[("RANK", "1"), ("MASTER_PORT", "x")]).unwrap(),
            None
        );
    }

    #[test]
    fn a_full_environment_is_read() {
        let e = lookup(&FULL).unwrap().unwrap();
        assert_eq!(
            e,
            DistEnv {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                local_world_size: 2,
                master_addr: "node0".into(),
                master_port: 1234,
            }
        );
        assert!(!e.is_main());
        assert_eq!(e.master(), "node0:1234");
    }

    #[test]
    fn defaults_of_a_one_process_group() {
        let e = lookup(&[("WORLD_SIZE", "1"), ("RANK", "0")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (0, 1, 0, 1)
        );
        assert_eq!(e.master(), "127.0.0.1:29500");
        assert!(e.is_main());
    }

    #[test]
    fn local_values_default_to_the_global_ones() {
        let mut v: Vec<_> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| !k.starts_with("LOCAL"))
            .collect();
        let e = lookup(&v).unwrap().unwrap();
        assert_eq!((e.local_rank, e.local_world_size), (3, 8));
        // LOCAL_RANK defaults to RANK = 3, which is refused next to LOCAL_WORLD_SIZE = 2.
        v.push(("LOCAL_WORLD_SIZE", "2"));
        assert_env_err(
            lookup(&v),
            "LOCAL_RANK",
            "3 is not below LOCAL_WORLD_SIZE=2",
        );
        assert_env_err(with("LOCAL_RANK", None), "LOCAL_RANK", "not below");
        // LOCAL_WORLD_SIZE defaults to WORLD_SIZE.
        let e = with("LOCAL_WORLD_SIZE", None).unwrap().unwrap();
        assert_eq!((e.local_rank, e.local_world_size), (1, 8));
    }

    #[test]
    fn whitespace_and_brackets_are_tolerated() {
        let e = lookup(&[
            ("WORLD_SIZE", " 2 "),
            ("RANK", "1\n"),
            ("MASTER_ADDR", "[::1]"),
            ("MASTER_PORT", " 29501"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.master_port), (1, 2, 29501));
        assert_eq!(e.master_addr, "::1");
        assert_eq!(e.master(), "[::1]:29501");
        let e = with("MASTER_ADDR", Some("fe80::1")).unwrap().unwrap();
        assert_eq!(e.master(), "[fe80::1]:1234");
    }

    #[test]
    fn missing_variables_are_errors() {
        assert_env_err(with("RANK", None), "RANK", "not set");
        assert_env_err(with("MASTER_ADDR", None), "MASTER_ADDR", "not set");
        assert_env_err(with("MASTER_PORT", None), "MASTER_PORT", "not set");
        // A one-process group needs RANK too.
        assert_env_err(lookup(&[("WORLD_SIZE", "1")]), "RANK", "not set");
    }

    #[test]
    fn malformed_numbers_are_errors_naming_the_value() {
        for (var, bad) in [
            ("WORLD_SIZE", "two"),
            ("WORLD_SIZE", "-1"),
            ("WORLD_SIZE", "1.5"),
            ("RANK", "x3"),
            ("RANK", "-1"),
            ("LOCAL_RANK", "one"),
            ("LOCAL_WORLD_SIZE", "2x"),
            ("MASTER_PORT", "http"),
            ("MASTER_PORT", "-5"),
        ] {
            assert_env_err(with(var, Some(bad)), var, &format!("{bad:?}"));
        }
    }

    #[test]
    fn empty_values_are_errors() {
        for var in VARS {
            assert_env_err(with(var, Some("")), var, "empty");
            assert_env_err(with(var, Some("  ")), var, "empty");
        }
    }

    #[test]
    fn out_of_range_values_are_errors() {
        for (var, value, why) in [
            ("WORLD_SIZE", "0", "at least 1"),
            ("WORLD_SIZE", "65537", "more than 65536 processes"),
            ("WORLD_SIZE", "18446744073709551615", "more than 65536"),
            ("LOCAL_WORLD_SIZE", "0", "at least 1"),
            ("RANK", "8", "not below WORLD_SIZE=8"),
            ("LOCAL_RANK", "2", "not below"),
            ("LOCAL_WORLD_SIZE", "9", "exceeds WORLD_SIZE=8"),
            ("MASTER_PORT", "0", "1..=65535"),
            ("MASTER_PORT", "65536", "1..=65535"),
            (
                "MASTER_PORT",
                "99999999999999999999999",
                "not a port number",
            ),
        ] {
            assert_env_err(with(var, Some(value)), var, why);
        }
        assert_eq!(
            with("MASTER_PORT", Some("65535"))
                .unwrap()
                .unwrap()
                .master_port,
            65535
        );
    }

    #[test]
    fn malformed_addresses_are_errors() {
        for bad in ["node0:29500", "a b", "[node0]", "10.0.0.1/24", "::zz"] {
            assert_env_err(
                with("MASTER_ADDR", Some(bad)),
                "MASTER_ADDR",
                &format!("{bad:?}"),
            );
        }
    }

    /// A value that is not UTF-8 is an error naming the variable (a variable only this test
    /// uses, so that the process environment of the other tests is untouched).
    #[test]
    fn non_utf8_values_are_errors() {
        use std::os::unix::ffi::OsStrExt;
        const VAR: &str = "HYBRID_TEST_ENV_NOT_UTF8";
        std::env::set_var(VAR, std::ffi::OsStr::from_bytes(b"2\xff"));
        match env_var(VAR) {
            Err(DistError::Env { var, reason }) => {
                assert_eq!(var, VAR);
                assert!(reason.contains("not valid UTF-8"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        std::env::set_var(VAR, "2");
        assert_eq!(env_var(VAR).unwrap().as_deref(), Some("2"));
        std::env::remove_var(VAR);
        assert_eq!(env_var(VAR).unwrap(), None);
    }
}
