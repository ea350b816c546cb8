//! The daemon's own resource limits: its open-file limit, raised at start, and a cap on client
//! connections per peer (a Unix user on the socket, an address over TCP) and in total. A client
//! that opens connections by the thousand gets 503s past its cap; it can never take the file
//! descriptors the engine needs to read `/proc`, job folders and SQLite.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// File descriptors kept out of the connections' reach, for the engine's own work (SQLite, job
/// folders, `/proc`, supervisors' pipes) and the runtime's.
pub const FD_RESERVE: u64 = 128;
/// The fewest connections a daemon accepts, whatever its open-file limit.
const MIN_CONNECTIONS: u64 = 16;

/// Raises this process's soft open-file limit to its hard limit; returns the limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        tracing::warn!(
            "cannot read the open-file limit: {}",
            std::io::Error::last_os_error()
        );
        return 1024;
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        } else {
            tracing::warn!(
                "cannot raise the open-file limit from {before}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let now = limit.rlim_cur;
    if now == before {
        tracing::info!("orch serve: open-file limit {now}");
    } else {
        tracing::info!("orch serve: open-file limit raised from {before} to {now}");
    }
    now
}

/// Who a connection counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A Unix user, on the socket.
    Uid(u32),
    /// An address, on the TCP listener.
    Addr(std::net::IpAddr),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(uid) => write!(f, "uid {uid}"),
            Peer::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: u64,
    per_peer: HashMap<Peer, u64>,
    /// Refusals since the last log line, per peer.
    refused: HashMap<Peer, u64>,
}

/// The open connections, counted.
#[derive(Debug)]
pub struct Connections {
    max_total: u64,
    max_per_peer: u64,
    counts: Mutex<Counts>,
}

/// One admitted connection; it stops counting when dropped.
#[derive(Debug)]
pub struct Admitted {
    connections: Arc<Connections>,
    peer: Peer,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = orch_core::sync::lock(&self.connections.counts);
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_peer.remove(&self.peer);
            }
        }
    }
}

impl Connections {
    /// Caps from the config, the total bounded by the open-file limit less [`FD_RESERVE`].
    pub fn new(max_total: u32, max_per_peer: u32, open_files: u64) -> Connections {
        let by_files = open_files.saturating_sub(FD_RESERVE).max(MIN_CONNECTIONS);
        Connections {
            max_total: u64::from(max_total).min(by_files),
            max_per_peer: u64::from(max_per_peer),
            counts: Mutex::default(),
        }
    }

    /// The total cap in force.
    pub fn max_total(&self) -> u64 {
        self.max_total
    }

    /// Counts a new connection of `peer`, or says why it is refused.
    pub fn admit(self: &Arc<Self>, peer: Peer) -> Result<Admitted, String> {
        let mut counts = orch_core::sync::lock(&self.counts);
        let mine = counts.per_peer.get(&peer).copied().unwrap_or(0);
        let refusal = if mine >= self.max_per_peer {
            Some(format!(
                "{peer} already has {mine} connections open to this daemon, its max_connections_per_peer; close some and try again"
            ))
        } else if counts.total >= self.max_total {
            Some(format!(
                "the daemon has {} connections open, its limit; try again shortly",
                counts.total
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            let refused = counts.refused.entry(peer.clone()).or_default();
            *refused += 1;
            // The first refusal of a burst, then every thousandth.
            if *refused == 1 || (*refused).is_multiple_of(1000) {
                tracing::warn!("connection refused ({refused} so far): {why}");
            }
            return Err(why);
        }
        counts.refused.remove(&peer);
        counts.total += 1;
        *counts.per_peer.entry(peer.clone()).or_default() += 1;
        Ok(Admitted {
            connections: Arc::clone(self),
            peer,
        })
    }
}

/// A whole HTTP/1.1 503 answer with `{"error": why}`, for a connection refused before hyper
/// sees it.
pub fn refusal_response(why: &str) -> Vec<u8> {
    answer("503 Service Unavailable", "retry-after: 1\r\n", why)
}

/// A whole HTTP/1.1 answer with `status` (`"400 Bad Request"`) and `{"error": why}` that closes
/// the connection, for a connection answered before hyper sees it.
pub fn plain_response(status: &str, why: &str) -> Vec<u8> {
    answer(status, "", why)
}

fn answer(status: &str, extra_headers: &str, why: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": why }).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra_headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_peer_and_in_total_and_counts_down() {
        let conns = Arc::new(Connections::new(3, 2, 10_000));
        let a1 = conns.admit(Peer::Uid(1000)).unwrap();
        let _a2 = conns.admit(Peer::Uid(1000)).unwrap();
        let third = conns.admit(Peer::Uid(1000)).unwrap_err();
        assert!(third.contains("uid 1000 already has 2"), "{third}");
        let _b1 = conns.admit(Peer::Uid(1001)).unwrap();
        let full = conns.admit(Peer::Uid(1002)).unwrap_err();
        assert!(full.contains("3 connections open"), "{full}");
        drop(a1);
        assert!(
            conns.admit(Peer::Uid(1002)).is_ok(),
            "a closed one frees a place"
        );
    }

    #[test]
    fn the_total_keeps_a_reserve_of_file_descriptors() {
        assert_eq!(
            Connections::new(4096, 256, 1024).max_total(),
            1024 - FD_RESERVE
        );
        assert_eq!(Connections::new(100, 256, 1 << 20).max_total(), 100);
        assert_eq!(Connections::new(4096, 256, 64).max_total(), MIN_CONNECTIONS);
    }

    #[test]
    fn raising_the_limit_never_lowers_it() {
        let mut before = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut before) },
            0
        );
        let now = raise_open_file_limit();
        assert!(now >= before.rlim_cur);
        assert_eq!(now, before.rlim_max);
    }

    #[test]
    fn a_refusal_is_a_whole_http_answer() {
        let text = String::from_utf8(refusal_response("busy")).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "));
        assert!(text.ends_with("{\"error\":\"busy\"}"));
        assert!(text.contains("content-length: 16\r\n"));
    }
}
