//! `orch history`: finished jobs and what each used (the daemon's `GET /v1/history`), as a
//! table, JSON or CSV; `--by tenant` sums them per tenant.

use crate::cli::HistoryArgs;
use crate::client::{Client, answer_failure};
use crate::failure::{CmdResult, Failure};
use crate::table;
use hyper::{Method, StatusCode};
use orch_serve::{HistoryJob, HistorySummary};

pub fn run(args: &HistoryArgs) -> CmdResult {
    let now_ms = orch_core::time::now_ms();
    let mut query = Vec::new();
    if let Some(since) = &args.since {
        query.push(format!("since_ms={}", moment("--since", since, now_ms)?));
    }
    if let Some(until) = &args.until {
        query.push(format!("until_ms={}", moment("--until", until, now_ms)?));
    }
    for (key, value) in [("user", &args.user), ("tenant", &args.tenant)] {
        if let Some(value) = value {
            query.push(format!("{key}={}", percent_encode(value)));
        }
    }
    for state in &args.state {
        if !matches!(
            state.as_str(),
            "succeeded" | "failed" | "cancelled" | "lost"
        ) {
            return Err(Failure::bad_input_msg(format!(
                "--state {} is not a state a finished job has: give succeeded, failed, cancelled or lost",
                table::escape(state)
            )));
        }
    }
    if !args.state.is_empty() {
        query.push(format!("state={}", args.state.join(",")));
    }
    if let Some(by) = &args.by {
        query.push(format!("by={by}"));
    }
    // One more than asked for tells whether more matched.
    let cap = orch_serve::http::history::HISTORY_LIMIT;
    let limit = if args.limit == 0 { cap } else { args.limit };
    if args.by.is_none() {
        query.push(format!("limit={}", limit.saturating_add(1).min(cap)));
    }
    let path = if query.is_empty() {
        "/v1/history".to_string()
    } else {
        format!("/v1/history?{}", query.join("&"))
    };
    let client = Client::from_env()?;
    let (status, body) = client.call(Method::GET, &path, None)?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &body));
    }
    let body = if args.by.is_none() {
        within(&body, limit, cap)?
    } else {
        body.to_vec()
    };
    if args.json {
        println!("{}", String::from_utf8_lossy(&body));
        return Ok(());
    }
    let out = if args.by.is_some() {
        let groups: Vec<HistorySummary> = serde_json::from_slice(&body).map_err(Failure::failed)?;
        let key = args.by.as_deref().unwrap_or("tenant");
        if args.csv {
            summary_csv(key, &groups)
        } else {
            summary_table(key, &groups)
        }
    } else {
        let jobs: Vec<HistoryJob> = serde_json::from_slice(&body).map_err(Failure::failed)?;
        if args.csv {
            jobs_csv(&jobs)
        } else {
            jobs_table(&jobs)
        }
    };
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`orch history | head`) ends the output quietly.
    let _ = stdout.write_all(out.as_bytes());
    Ok(())
}

/// The daemon's list of jobs (`body`, oldest first) cut to its newest `limit`, with a line on
/// stderr when more matched (or when the daemon's `cap` may have cut it).
fn within(body: &[u8], limit: u32, cap: u32) -> Result<Vec<u8>, Failure> {
    // Counted without building the jobs; built only to cut them.
    let count = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(body)
        .map_err(Failure::failed)?
        .len();
    let limit = limit as usize;
    if count > limit {
        let mut jobs: Vec<serde_json::Value> =
            serde_json::from_slice(body).map_err(Failure::failed)?;
        eprintln!(
            "orch history: more jobs matched than the newest {limit} shown: give --limit N for more (--limit 0 for up to {cap}), or a narrower --since"
        );
        jobs.drain(..jobs.len() - limit);
        return serde_json::to_vec(&jobs).map_err(Failure::failed);
    }
    if count >= cap as usize {
        eprintln!(
            "orch history: one answer holds at most {cap} jobs, the newest: give a narrower --since or --until for older ones"
        );
    }
    Ok(body.to_vec())
}

/// A `--since`/`--until` value as ms since the Unix epoch: a duration back from `now_ms` (`30d`),
/// a date (`2026-11-01`, midnight UTC) or a time `YYYY-MM-DDTHH:MM[:SS[.frac]]` with `Z` or an
/// offset `+HH:MM`/`-HH:MM` (RFC 3339), or without one for UTC; a moment before the epoch is 0.
fn moment(flag: &str, text: &str, now_ms: u64) -> Result<u64, Failure> {
    let t = text.trim();
    if let Some(back) = orch_core::duration::parse(t) {
        let back = u64::try_from(back.as_millis()).unwrap_or(u64::MAX);
        return Ok(now_ms.saturating_sub(back));
    }
    match utc_ms(t) {
        Some(ms) => Ok(u64::try_from(ms).unwrap_or(0)),
        None => Err(Failure::bad_input_msg(format!(
            "{flag} \"{}\" is neither a duration back from now (30d, 12h) nor a date or time (2026-11-01, 2026-11-01T08:00:00Z, 2026-11-01T09:00:00+01:00; without a zone, UTC)",
            table::escape(text)
        ))),
    }
}

/// `YYYY-MM-DD[(T| )HH:MM[:SS[.frac]][Z|(+|-)HH:MM]]` as ms since the Unix epoch (negative
/// before it); `None` when it is not such a moment.
fn utc_ms(t: &str) -> Option<i64> {
    fn digits(s: &str, n: usize) -> Option<i64> {
        (s.len() == n && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    }
    let (date, time) = match t.find(['T', 't', ' ']) {
        Some(at) => (&t[..at], Some(&t[at + 1..])),
        None => (t, None),
    };
    let mut parts = date.split('-');
    let year = digits(parts.next()?, 4)?;
    let month = digits(parts.next()?, 2)?;
    let day = digits(parts.next()?, 2)?;
    if parts.next().is_some() || !(1..=12).contains(&month) {
        return None;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=month_days).contains(&day) {
        return None;
    }
    // Days from 1970-01-01 to the date (the proleptic Gregorian calendar).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let of_era = y - era * 400;
    let of_year = (153 * m + 2) / 5 + day - 1;
    let of_cycle = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    let days = era * 146_097 + of_cycle - 719_468;
    let Some(time) = time else {
        return Some(days * 86_400_000);
    };
    // The zone: `Z`, an offset, or none (UTC).
    let (clock, offset_min) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else if let Some(at) = time.rfind(['+', '-']) {
        let (clock, zone) = time.split_at(at);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, m) = zone[1..].split_once(':')?;
        let (h, m) = (digits(h, 2)?, digits(m, 2)?);
        if h > 23 || m > 59 {
            return None;
        }
        (clock, sign * (h * 60 + m))
    } else {
        (time, 0)
    };
    let (clock, frac_ms) = match clock.split_once('.') {
        Some((clock, frac)) => {
            if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let first: String = frac.chars().chain("000".chars()).take(3).collect();
            (clock, Some(first.parse::<i64>().ok()?))
        }
        None => (clock, None),
    };
    let mut fields = clock.split(':');
    let hour = digits(fields.next()?, 2)?;
    let minute = digits(fields.next()?, 2)?;
    let second = match fields.next() {
        Some(s) => digits(s, 2)?,
        // A fraction belongs to the seconds.
        None if frac_ms.is_none() => 0,
        None => return None,
    };
    if fields.next().is_some() || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_min * 60;
    Some(seconds * 1_000 + frac_ms.unwrap_or(0))
}

/// `text` for a query string: what is not a letter, digit, `-`, `_` or `.` as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn clock(ms: u64) -> String {
    orch_core::time::rfc3339(ms)
}

/// Seconds as a table shows them: `42s`, `3m05s`, `2h10m`.
fn span(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

fn bytes(n: Option<u64>) -> String {
    match n {
        None => "-".into(),
        Some(n) if n >= 1 << 30 => format!("{:.1}G", n as f64 / f64::from(1u32 << 30)),
        Some(n) => format!("{:.0}M", n as f64 / f64::from(1u32 << 20)),
    }
}

fn jobs_table(jobs: &[HistoryJob]) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let a = &j.accounting;
            vec![
                j.id.to_string(),
                j.user.clone(),
                j.tenant.clone(),
                j.name.clone(),
                j.state.as_str().to_string(),
                match (j.exit_code, j.signal) {
                    (_, Some(signal)) => format!("sig {signal}"),
                    (Some(code), None) => code.to_string(),
                    (None, None) => "-".into(),
                },
                clock(j.ended_at_ms),
                span(a.queue_wait_s),
                span(a.wall_s),
                j.gpus.to_string(),
                format!("{:.1}", a.gpu_seconds),
                a.cpu_seconds.map_or("-".into(), |s| format!("{s:.1}")),
                bytes(a.peak_rss_bytes),
                bytes(a.peak_gpu_memory_bytes),
                a.mean_gpu_utilization
                    .map_or("-".into(), |u| format!("{u:.0}%")),
            ]
        })
        .collect();
    table::render(
        &[
            "ID", "USER", "TENANT", "NAME", "STATE", "EXIT", "ENDED", "WAIT", "WALL", "GPUS",
            "GPU-S", "CPU-S", "RSS", "GPU-MEM", "GPU-UTIL",
        ],
        &rows,
    )
}

fn summary_table(key: &str, groups: &[HistorySummary]) -> String {
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                g.key.clone(),
                g.jobs.to_string(),
                format!("{:.2}", g.gpu_hours),
                g.mean_gpu_utilization
                    .map_or("-".into(), |u| format!("{u:.0}%")),
            ]
        })
        .collect();
    let key = key.to_uppercase();
    table::render(&[&key, "JOBS", "GPU-HOURS", "MEAN-GPU-UTIL"], &rows)
}

/// One CSV field: quoted when it holds a comma, a quote or a line break (quotes doubled).
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn line(fields: &[String]) -> String {
    let mut text = fields
        .iter()
        .map(|f| field(f))
        .collect::<Vec<_>>()
        .join(",");
    text.push('\n');
    text
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

const JOB_COLUMNS: &[&str] = &[
    "id",
    "name",
    "tenant",
    "user",
    "state",
    "submitted_at",
    "started_at",
    "ended_at",
    "attempt",
    "gpus",
    "devices",
    "gpu_seconds",
    "wall_s",
    "queue_wait_s",
    "cpu_seconds",
    "peak_rss_bytes",
    "peak_gpu_memory_bytes",
    "mean_gpu_utilization",
    "exit_code",
    "signal",
    "reason",
];

fn jobs_csv(jobs: &[HistoryJob]) -> String {
    let header: Vec<String> = JOB_COLUMNS.iter().map(|c| c.to_string()).collect();
    let mut out = line(&header);
    for j in jobs {
        let a = &j.accounting;
        out.push_str(&line(&[
            j.id.to_string(),
            j.name.clone(),
            j.tenant.clone(),
            j.user.clone(),
            j.state.as_str().to_string(),
            clock(j.submitted_at_ms),
            opt(j.started_at_ms.map(clock)),
            clock(j.ended_at_ms),
            j.attempt.to_string(),
            j.gpus.to_string(),
            a.devices.join(" "),
            a.gpu_seconds.to_string(),
            a.wall_s.to_string(),
            a.queue_wait_s.to_string(),
            opt(a.cpu_seconds),
            opt(a.peak_rss_bytes),
            opt(a.peak_gpu_memory_bytes),
            opt(a.mean_gpu_utilization),
            opt(j.exit_code),
            opt(j.signal),
            j.reason.clone().unwrap_or_default(),
        ]));
    }
    out
}

fn summary_csv(key: &str, groups: &[HistorySummary]) -> String {
    let mut out = line(&[
        key.to_string(),
        "jobs".into(),
        "gpu_hours".into(),
        "gpu_seconds".into(),
        "mean_gpu_utilization".into(),
    ]);
    for g in groups {
        out.push_str(&line(&[
            g.key.clone(),
            g.jobs.to_string(),
            g.gpu_hours.to_string(),
            g.gpu_seconds.to_string(),
            opt(g.mean_gpu_utilization),
        ]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_with_a_comma_quote_or_line_break_is_quoted() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
        assert_eq!(
            line(&["a".into(), "b,c".into(), String::new()]),
            "a,\"b,c\",\n"
        );
    }

    #[test]
    fn a_moment_is_a_duration_back_a_date_or_a_time_and_anything_else_one_sentence() {
        let now = 1_800_000_000_000;
        assert_eq!(moment("--since", "1d", now).unwrap(), now - 86_400_000);
        assert_eq!(
            moment("--since", "2026-11-01", now).unwrap(),
            1_793_491_200_000
        );
        assert_eq!(
            moment("--until", "2026-11-01T08:00:00Z", now).unwrap(),
            1_793_491_200_000 + 8 * 3_600_000
        );
        // An offset is taken as RFC 3339 says: 09:00 at +01:00 is 08:00 UTC.
        for same in [
            "2026-11-01T09:00:00+01:00",
            "2026-11-01T03:30:00-04:30",
            "2026-11-01T08:00:00.000Z",
            "2026-11-01t08:00:00z",
            "2026-11-01T08:00",
            "2026-11-01 08:00:00",
        ] {
            assert_eq!(
                moment("--until", same, now).unwrap(),
                1_793_491_200_000 + 8 * 3_600_000,
                "{same}"
            );
        }
        assert_eq!(
            moment("--since", "2026-11-01T08:00:00.25+00:00", now).unwrap(),
            1_793_491_200_000 + 8 * 3_600_000 + 250
        );
        assert_eq!(
            moment("--since", "2024-02-29", now).unwrap(),
            1_709_164_800_000
        );
        assert_eq!(moment("--since", "1969-12-31T23:00:00Z", now).unwrap(), 0);
        for bad in [
            "2026-13-01",
            "2025-02-29",
            "2026-11-01T24:00:00Z",
            "2026-11-01T08:00:00+1:00",
            "2026-11-01T08:00:00+01:60",
            "2026-11-01T08:00:00.Z",
            "2026-11-01T08",
            "2026-11-01T08:00.5Z",
            "2026-1-01",
        ] {
            assert!(moment("--since", bad, now).is_err(), "{bad}");
        }
        let why = moment("--since", "yesterday-ish", now)
            .unwrap_err()
            .render();
        assert!(
            why.contains("--since \"yesterday-ish\" is neither"),
            "{why}"
        );
        assert_eq!(why.trim().lines().count(), 1, "{why}");
    }
}
