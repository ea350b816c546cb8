//! Statements through SQLite's statement cache, for the lease store and the daemon's job
//! database: both run the same few statements for every job, and preparing each again every time
//! was a tenth of the daemon's work per job. The cache is the connection's (rusqlite keeps 16
//! statements by default; `Connection::set_prepared_statement_cache_capacity` sets more).

use rusqlite::{Connection, Params, Row};

/// `conn.execute(sql, params)`, with `sql` prepared once per connection.
pub fn exec(conn: &Connection, sql: &str, params: impl Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// `conn.query_row(sql, params, f)`, with `sql` prepared once per connection.
pub fn query_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// Puts the database in write-ahead-log mode, waiting up to `patience` for other processes.
///
/// Switching a new database to WAL takes its exclusive lock, and SQLite answers "database is
/// locked" at once, without the busy handler, when two connections would otherwise wait on each
/// other: several processes opening a new store together (fifty `orch run`s, the ranks of one
/// Slurm job) each ask for the switch and all but one can be refused. The mode is the file's, so
/// one success is enough; the others retry until they see it.
pub fn use_wal(conn: &Connection, patience: std::time::Duration) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + patience;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Ok(()) => return Ok(()),
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `e` is SQLite's "busy" or "locked": another connection holds what this one needs.
pub fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
